"""Latency targets (SLOs) per request: what a request asks (``targets``), the step-cost model
learned from the engine's own steps (``cost_model``), the first-token prediction
(``predictor``) and the scheduler's admission, order and prefill cap (``scheduling``)."""
