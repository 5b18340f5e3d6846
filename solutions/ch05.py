"""Chapter 5 reference solution."""

import numpy as np


def line12(o_i, l_i, m_i, p_tilde, m_tilde, v_j, l_new, m_new):
    def rebase(m_from):  # e^(m_from - m_new), 0 where nothing was accumulated (m_from = -inf)
        safe_new = np.where(np.isneginf(m_new), 0.0, m_new)
        return np.where(np.isneginf(m_from), 0.0, np.exp(m_from - safe_new))

    raw_old = l_i[:, None] * o_i  # move 1: undo the old normalisation
    green = rebase(m_i)[:, None] * raw_old  # move 2: re-base the old half ...
    yellow = rebase(m_tilde)[:, None] * (p_tilde @ v_j)  # ... and the new half on m_new
    safe_l = np.where(l_new > 0, l_new, 1.0)
    return np.where(l_new[:, None] > 0, (green + yellow) / safe_l[:, None], 0.0)  # move 3
