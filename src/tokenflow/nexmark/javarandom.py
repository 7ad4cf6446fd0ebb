"""``java.util.Random``, scalar and vectorized over lanes (one generator per lane).

Source: docs/NEXMARK.md ("Random stream") and OpenJDK's ``java/util/Random.java``
(JDK 17): a 48-bit linear congruential generator

* ``setSeed(s)``:  ``state = (s ^ 0x5DEECE66D) & (2**48 - 1)``
* ``next(bits)``:  ``state = (state * 0x5DEECE66D + 0xB) & (2**48 - 1)``; the result is
  ``(int)(state >>> (48 - bits))`` (a signed 32-bit value for ``bits == 32``)
* ``nextInt()`` = ``next(32)``
* ``nextInt(bound)``: ``r = next(31)``; a power-of-two ``bound`` gives ``(bound * r) >> 31``;
  otherwise ``r % bound``, re-drawn while ``u - r + (bound - 1)`` overflows a Java ``int``
  (equivalently while ``u >= (2**31 // bound) * bound``)
* ``nextDouble()`` = ``((next(26) << 27) + next(27)) * 2**-53``

``JavaRandom`` is the scalar reference (one Python call per draw, for debugging and small
jobs).  ``LaneRandom`` keeps the states of N generators in a ``uint64`` array and draws for all
lanes, or for a subset of lanes given as an index array, in one numpy operation each; a lane
that is not in the subset does not advance.  ``LaneRandom.next_int_block`` draws K successive
``nextInt()`` values per lane at once using the LCG's jump-ahead constants (``peek_states`` /
``advance``: ``j`` steps map ``s`` to ``a_j * s + c_j mod 2**48``).
"""

from __future__ import annotations

import numpy as np

MULTIPLIER = 0x5DEECE66D
"""The LCG multiplier (``java.util.Random``)."""
ADDEND = 0xB
"""The LCG increment."""
MASK = (1 << 48) - 1
"""The state is 48 bits."""
DOUBLE_UNIT = 1.0 / (1 << 53)
"""``nextDouble`` scale: 2**-53."""
INT_MAX = (1 << 31) - 1
"""Java's ``Integer.MAX_VALUE``."""

_M = np.uint64(MULTIPLIER)
_A = np.uint64(ADDEND)
_MASK = np.uint64(MASK)
_SHIFT31 = np.uint64(17)
_SHIFT32 = np.uint64(16)


def scramble(seed: int) -> int:
    """The initial state for seed ``seed`` (a Java ``long``): ``(seed ^ 0x5DEECE66D) & mask``."""
    return (seed ^ MULTIPLIER) & MASK


def _to_int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


class JavaRandom:
    """Scalar ``java.util.Random(seed)`` (reference implementation, one call per draw)."""

    __slots__ = ("state",)

    def __init__(self, seed: int) -> None:
        self.state = scramble(seed)

    def next(self, bits: int) -> int:
        """``next(bits)``: advance the state; return its top ``bits`` bits as a Java ``int``."""
        self.state = (self.state * MULTIPLIER + ADDEND) & MASK
        return _to_int32(self.state >> (48 - bits))

    def next_int(self, bound: int | None = None) -> int:
        """``nextInt()`` (a signed 32-bit value) or ``nextInt(bound)`` in ``[0, bound)``.

        Raises:
            ValueError: for ``bound <= 0`` or ``bound > Integer.MAX_VALUE``.
        """
        if bound is None:
            return self.next(32)
        if bound <= 0 or bound > INT_MAX:
            raise ValueError(f"bound must be in [1, {INT_MAX}], got {bound}")
        r = self.next(31)
        m = bound - 1
        if bound & m == 0:
            return (bound * r) >> 31
        u = r
        r = u % bound
        while u - r + m > INT_MAX:  # Java: the int sum overflows (is negative)
            u = self.next(31)
            r = u % bound
        return r

    def next_long(self) -> int:
        """``nextLong()``: ``((long) next(32) << 32) + next(32)`` as a signed 64-bit value."""
        value = (self.next(32) << 32) + self.next(32)
        value &= (1 << 64) - 1
        return value - (1 << 64) if value >= 1 << 63 else value

    def next_double(self) -> float:
        """``nextDouble()`` in ``[0, 1)`` with 53 random bits."""
        return ((self.next(26) << 27) + self.next(27)) * DOUBLE_UNIT


def jump_constants(k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, c)`` arrays of length ``k``: ``j+1`` LCG steps map a state ``s`` to
    ``(a[j] * s + c[j]) mod 2**48`` (uint64 arithmetic wraps mod 2**64, then mask)."""
    a = np.empty(k, dtype=np.uint64)
    c = np.empty(k, dtype=np.uint64)
    ai, ci = 1, 0
    for j in range(k):
        ai, ci = (ai * MULTIPLIER) & MASK, (ci * MULTIPLIER + ADDEND) & MASK
        a[j] = ai
        c[j] = ci
    return a, c


class LaneRandom:
    """N independent ``java.util.Random`` generators ("lanes"), advanced with numpy.

    ``state`` is a ``uint64`` array of shape ``(N,)`` holding each lane's 48-bit state.  Every
    draw method takes ``lanes``: ``None`` for all lanes, or an ``int64`` index array of the lanes
    that draw (each at most once, in any order); results follow the order of ``lanes``.
    """

    __slots__ = ("state",)

    def __init__(self, seeds: np.ndarray) -> None:
        """``seeds``: int64 array, one Java ``long`` seed per lane (``new Random(seed)``)."""
        self.state = (np.asarray(seeds, dtype=np.int64).astype(np.uint64) ^ _M) & _MASK

    def __len__(self) -> int:
        return len(self.state)

    def _step(self, lanes: np.ndarray | None) -> np.ndarray:
        """Advance the selected lanes one LCG step; return their new states (uint64)."""
        if lanes is None:
            s = self.state
            s *= _M
            s += _A
            s &= _MASK
            return s
        s = self.state[lanes]
        s *= _M
        s += _A
        s &= _MASK
        self.state[lanes] = s
        return s

    def next31(self, lanes: np.ndarray | None = None) -> np.ndarray:
        """``next(31)`` per selected lane: int64 values in ``[0, 2**31)``."""
        return (self._step(lanes) >> _SHIFT31).astype(np.int64)

    def next_int(self, lanes: np.ndarray | None = None) -> np.ndarray:
        """``nextInt()`` per selected lane: int64 arrays holding signed 32-bit values."""
        return (self._step(lanes) >> _SHIFT32).astype(np.uint32).view(np.int32).astype(np.int64)

    def next_int_bounded(self, bound: int | np.ndarray,
                         lanes: np.ndarray | None = None) -> np.ndarray:
        """``nextInt(bound)`` per selected lane, ``bound`` a scalar or one bound per selected lane.

        Power-of-two bounds take ``(bound * r) >> 31``; other bounds ``r % bound`` and re-draw
        only the rejected lanes (``u >= (2**31 // bound) * bound``) until none is left.

        Raises:
            ValueError: for a bound outside ``[1, Integer.MAX_VALUE]``.
        """
        r = self.next31(lanes)
        if np.isscalar(bound):
            b = int(bound)
            if b <= 0 or b > INT_MAX:
                raise ValueError(f"bound must be in [1, {INT_MAX}], got {b}")
            if b & (b - 1) == 0:
                return (r * b) >> 31
            limit = ((1 << 31) // b) * b
            bad = np.flatnonzero(r >= limit)
            while len(bad):
                sub = bad if lanes is None else lanes[bad]
                u = self.next31(sub)
                r[bad] = u
                bad = bad[u >= limit]
            return r % b
        bounds = np.asarray(bound, dtype=np.int64)
        if len(bounds) and (bounds.min() <= 0 or bounds.max() > INT_MAX):
            raise ValueError(f"bounds must be in [1, {INT_MAX}], got [{bounds.min()}, {bounds.max()}]")
        pow2 = (bounds & (bounds - 1)) == 0
        limit = ((1 << 31) // bounds) * bounds
        bad = np.flatnonzero(~pow2 & (r >= limit))
        while len(bad):
            sub = bad if lanes is None else lanes[bad]
            u = self.next31(sub)
            r[bad] = u
            bad = bad[u >= limit[bad]]
        return np.where(pow2, (r * bounds) >> 31, r % bounds)

    def next_double(self, lanes: np.ndarray | None = None) -> np.ndarray:
        """``nextDouble()`` per selected lane: float64 in ``[0, 1)``."""
        hi = (self._step(lanes) >> np.uint64(22)).astype(np.int64)
        lo = (self._step(lanes) >> np.uint64(21)).astype(np.int64)
        return ((hi << 27) + lo) * DOUBLE_UNIT

    def peek_states(self, width: int, lanes: np.ndarray | None = None) -> np.ndarray:
        """The states after 1, 2, ..., ``width`` more steps of each selected lane, without
        advancing: a ``uint64`` matrix of shape ``(len(lanes), width)`` (LCG jump-ahead)."""
        s0 = self.state if lanes is None else self.state[lanes]
        a, c = _jump(width)
        states = s0[:, None] * a[None, :width]
        states += c[None, :width]
        states &= _MASK
        return states

    def peek_steps(self, width: int) -> np.ndarray:
        """``peek_states(width)`` for every lane, transposed: row ``j`` holds every lane's state
        after ``j + 1`` more steps (``uint64``, shape ``(width, len(self))``), so that scans over
        the steps (``np.cumsum(..., axis=0)``) run along rows, vectorized over the lanes."""
        a, c = _jump(width)
        states = a[:width, None] * self.state[None, :]
        states += c[:width, None]
        states &= _MASK
        return states

    def advance(self, states: np.ndarray, counts: np.ndarray,
                lanes: np.ndarray | None = None) -> None:
        """Move each selected lane ``counts[i]`` steps ahead, given ``states = peek_states(...)``
        for the same lanes (``counts[i] == 0`` leaves the lane as it is)."""
        counts = np.asarray(counts, dtype=np.int64)
        s0 = self.state if lanes is None else self.state[lanes]
        if states.shape[1] == 0:
            return
        final = np.where(counts > 0, states[np.arange(len(s0)), np.maximum(counts - 1, 0)], s0)
        if lanes is None:
            self.state[:] = final
        else:
            self.state[lanes] = final

    def next_int_block(self, counts: np.ndarray, lanes: np.ndarray | None = None,
                       signed: bool = True) -> np.ndarray:
        """``counts[i]`` successive ``nextInt()`` draws for selected lane ``i``, at once.

        Returns a matrix of shape ``(len(lanes), max(counts))`` whose row ``i`` holds the lane's
        draws in order (entries past ``counts[i]`` are draws that were *not* taken: the lane's
        state advances by exactly ``counts[i]`` steps): int64 signed 32-bit values, or with
        ``signed=False`` the same 32 bits as ``uint32``.
        """
        counts = np.asarray(counts, dtype=np.int64)
        width = int(counts.max()) if len(counts) else 0
        states = self.peek_states(width, lanes)
        self.advance(states, counts, lanes)
        raw = (states >> _SHIFT32).astype(np.uint32)
        return raw.view(np.int32).astype(np.int64) if signed else raw


_JUMPS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _jump(width: int) -> tuple[np.ndarray, np.ndarray]:
    size = max(64, 1 << max(width - 1, 0).bit_length())
    if size not in _JUMPS:
        _JUMPS[size] = jump_constants(size)
    return _JUMPS[size]
