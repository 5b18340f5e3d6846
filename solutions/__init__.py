"""Reference solutions to the exercises, one module per chapter.

Kept outside the reader's path: no notebook imports this package. The tests import it to prove
every checker accepts a right answer. Try the exercise before you look.
"""
