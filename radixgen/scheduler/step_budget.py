"""StepBudget: how much prompt a step may compute so that the step stays under ``max_step_ms``.

A step's time is modelled as a line in the work of its prompt tokens::

    step_ms ~= base_ms + ms_per_unit * sum over prompt chunks of work(n, context)
    work(n, context) = n * (1 + (context + n / 2) / attention_horizon)

``base_ms`` is what a step costs whatever its prompt work (reading the weights, the decode
rows, sampling); ``work`` counts a prompt token as its matmuls plus its attention over the
tokens before it, ``attention_horizon`` being the context length at which one token's
attention costs as many FLOPs as its matmuls (from the model's shape), so a chunk deep into
an 8,000-token prompt is given fewer tokens than the first one. The line is fitted by least
squares to recent steps with prompt work (older ones weigh less), anchored at zero work by the
moving average of steps without any. Until a prompt step has been measured the budget starts
at ``PROBE_TOKENS`` and it at most doubles per measured step, so a slow device never sees one
huge first chunk. ``max_step_ms <= 0`` turns the time bound off: only the token cap
(``chunked_prefill_size``) applies.
"""

from __future__ import annotations

PROBE_TOKENS = 64  # the first prompt chunk, before any prompt step was measured
MIN_TOKENS = 16  # a step always computes at least this much of a prompt (progress)
EMA_ALPHA = 0.3  # weight of the newest measurement in the moving averages


def attention_horizon(
    hidden: int, intermediate: int, num_heads: int, num_kv_heads: int, head_dim: int
) -> float:
    """Context length at which one token's attention FLOPs equal its per-layer matmul FLOPs."""
    matmul = 2 * hidden * num_heads * head_dim + 2 * hidden * num_kv_heads * head_dim
    matmul += 3 * hidden * intermediate  # gate, up, down
    return matmul / (2 * num_heads * head_dim)  # scores + weighted values: 2 * heads * dim per key


def work(num_tokens: int, context: int, horizon: float) -> float:
    """Cost units of computing ``num_tokens`` prompt tokens after ``context`` cached ones."""
    return num_tokens * (1.0 + (context + num_tokens / 2) / horizon)


class StepBudget:
    """Learns step costs from measured steps; tells the scheduler how much prompt fits a step."""

    def __init__(self, max_step_ms: float, max_tokens: int, horizon: float) -> None:
        self.max_step_ms = max_step_ms  # <= 0: no time bound
        self.max_tokens = max_tokens  # the token cap per step (chunked_prefill_size)
        self.horizon = horizon  # attention_horizon of the model
        self.idle_ms = 0.0  # moving average of steps without prompt work (0: none seen)
        self.base_ms = 0.0
        self.ms_per_unit: float | None = None  # None until a prompt step was measured
        self._sums = [0.0] * 5  # decayed sums of 1, x, y, x*x, x*y over prompt steps
        self._cap_units = float(PROBE_TOKENS)

    @property
    def timed(self) -> bool:
        return self.max_step_ms > 0

    def units(self) -> float:
        """Prompt work units a step may spend: at least ``MIN_TOKENS``' worth, even when the
        step's fixed part alone outlasts the target (a loaded machine), so prompts always
        progress and admission never stops."""
        if not self.timed:
            return float("inf")
        if self.ms_per_unit is None:
            return self._cap_units
        left = max(self.max_step_ms - self.base_ms, 0.0)
        return max(min(left / self.ms_per_unit, self._cap_units), float(MIN_TOKENS))

    def tokens(self, units: float, context: int, remaining: int) -> int:
        """Prompt tokens of a row after ``context`` computed ones that fit in ``units``
        (at most ``remaining`` and the token cap; at least ``MIN_TOKENS`` unless less remains)."""
        cap = min(remaining, self.max_tokens)
        if units == float("inf"):
            return cap
        # largest n with n * (1 + (context + n/2) / h) <= units: the positive root of a quadratic
        h, units = self.horizon, max(units, 0.0)
        a, b = 1.0 / (2 * h), 1.0 + context / h
        n = int((-b + (b * b + 4 * a * units) ** 0.5) / (2 * a))
        return max(min(n, cap), min(MIN_TOKENS, cap))

    def observe(self, elapsed_ms: float, units: float) -> None:
        """Record a step that spent ``units`` of prompt work in ``elapsed_ms``."""
        if units <= 0:
            self.idle_ms = _ema(self.idle_ms or elapsed_ms, elapsed_ms)
            if self.ms_per_unit is None:
                self.base_ms = self.idle_ms
            return
        sums = [v * (1 - EMA_ALPHA) for v in self._sums]
        for k, v in enumerate((1.0, units, elapsed_ms, units * units, units * elapsed_ms)):
            sums[k] += v
        self._sums = sums
        self.base_ms, self.ms_per_unit = self._fit()
        # grow the cap only from steps that used it (a small step says little about a big one)
        if units >= 0.5 * self._cap_units:
            self._cap_units = min(2 * self._cap_units, float(self.max_tokens) * 4)

    def _fit(self) -> tuple[float, float]:
        """(base_ms, ms_per_unit) by weighted least squares over the prompt steps, plus the
        idle steps' average as one point at zero work."""
        n, sx, sy, sxx, sxy = self._sums
        if self.idle_ms > 0:
            n, sy = n + 1.0, sy + self.idle_ms
        det = n * sxx - sx * sx
        if det > 1e-6 * n * sxx:
            slope = (n * sxy - sx * sy) / det
            base = (sy - slope * sx) / n
            if slope > 0 and base >= 0:
                return base, slope
        base = self.idle_ms  # too little spread to fit a line: through the idle average
        return base, max((sy / n - base) / (sx / n), 1e-6) if sx > 0 else 1e-6

    def as_dict(self) -> dict[str, float | None]:
        return {
            "max_step_ms": self.max_step_ms,
            "step_base_ms": round(self.base_ms, 2),
            "ms_per_prompt_token": None if self.ms_per_unit is None else round(self.ms_per_unit, 4),
        }


def _ema(old: float, new: float) -> float:
    return (1 - EMA_ALPHA) * old + EMA_ALPHA * new
