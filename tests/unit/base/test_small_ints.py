"""app.base.small_ints answers exactly as np.unique, whichever path (counting or sorting) it takes."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from app.base.small_ints import distinct, group

COLUMNS = st.one_of(
    st.lists(st.integers(0, 40), max_size=600),  # class keys, shape ids: the counting path
    st.lists(st.integers(-600, 40), max_size=60),  # unknown nodes and own classes are negative
    st.lists(st.integers(0, 10**9), max_size=20),  # too sparse to count
)


@given(COLUMNS)
def test_group_is_np_unique(values: list[int]) -> None:
    a = np.array(values, dtype=np.int64)
    uniq, first, inverse = np.unique(a, return_index=True, return_inverse=True)
    got = group(a)
    assert got[0].tolist() == uniq.tolist()
    assert got[1].tolist() == first.tolist()
    assert got[2].tolist() == inverse.reshape(-1).tolist()
    assert all(x.dtype == np.int64 for x in got)


@given(COLUMNS)
def test_distinct_is_np_unique(values: list[int]) -> None:
    a = np.array(values, dtype=np.int64)
    assert distinct(a) == np.unique(a).tolist()
