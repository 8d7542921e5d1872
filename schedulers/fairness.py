"""Our fairness bound for the default GPU policy: no model's bad rate runs far ahead of the rest.

Symphony's goodput counts a load as served only when EVERY model keeps its p99 within its SLO
(Section 2), and its flat-top asks that an overload be shed evenly (Section 4.4). A choice that
only looks at batch efficiency or urgency sheds the overload onto whichever models lose those
comparisons (measured on Symphony's 1080Ti zoo at 2x the peak: the worst model lost 74% of its
requests against 37% over all). The tracker keeps, per model and over all, a moving bad rate
(requests refused, or answered after their SLA, over those that ended): an exponential average
per request, over about the last 100 of a model and the last 1,000 of all. A model whose rate
is more than ``FAIRNESS_GAP`` over the overall rate is *behind*: the default policy serves its
candidates before anyone else's (schedulers/gpu.py).
"""

from __future__ import annotations

# The bound on a model's bad rate over the overall one that the flat-top asks for is 0.2; the
# moving rates lag the run's own, so the tracker acts somewhat earlier.
FAIRNESS_GAP = 0.18
MODEL_WEIGHT = 0.01  # about the last 100 requests of a model
OVERALL_WEIGHT = 0.001  # about the last 1,000 requests of all models
RESCAN = 256
# A slower average over all models, about the last 10,000 requests (a second or more at the
# peaks of Symphony's zoos): a burst that a moment's refusals answer does not move it, a
# sustained overload does (the default's shedding, schedulers/gpu.py).
SUSTAINED_WEIGHT = 0.0001


class BadRateTracker:
    def __init__(self, gap: float = FAIRNESS_GAP, model_weight: float = MODEL_WEIGHT, overall_weight: float = OVERALL_WEIGHT):
        self.gap, self.model_weight, self.overall_weight = gap, model_weight, overall_weight
        self.by_model: dict[str, float] = {}
        self.overall = 0.0
        self.sustained = 0.0  # the same over all models, averaged over about 10,000 requests
        # The models behind, kept as the records come (an ordered set: a dict to None), so that
        # a decision reads them in O(1) when there are none. A model's place is looked at when
        # it records; all of them every ``RESCAN`` records, as the overall rate moves.
        self.behind_models: dict[str, None] = {}
        self._records = 0

    def record(self, model: str, bad: int, ended: int = 1) -> None:
        """``ended`` requests of ``model`` ended (a batch's), ``bad`` of them not in their SLA (late or refused).

        They move the averages as ``ended`` requests one after another would, each the batch's
        mean: a weight w applied n times is 1 - (1 - w)^n applied once.
        """
        if ended <= 0:
            return
        mean = bad / ended
        rate = self.by_model.get(model, 0.0)
        self.by_model[model] = rate + (1 - (1 - self.model_weight) ** ended) * (mean - rate)
        self.overall += (1 - (1 - self.overall_weight) ** ended) * (mean - self.overall)
        self.sustained += (1 - (1 - SUSTAINED_WEIGHT) ** ended) * (mean - self.sustained)
        before = self._records
        self._records += ended
        rescan = self._records // RESCAN != before // RESCAN
        for name in self.by_model if rescan else (model,):
            if self.behind(name):
                self.behind_models[name] = None
            else:
                self.behind_models.pop(name, None)

    def behind(self, model: str) -> bool:
        """Whether the model's moving bad rate is more than the gap over the overall one."""
        return self.by_model.get(model, 0.0) > self.overall + self.gap
