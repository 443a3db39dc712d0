"""Prometheus metrics of the server (``GET /metrics``, the text exposition format, via ``prometheus-client``).

    lmforge_requests_total{endpoint,status}          requests answered, by HTTP status
    lmforge_request_seconds{endpoint}                latency histogram (whole request, stream included)
    lmforge_time_to_first_token_seconds{model}       submission to the first generated token
    lmforge_prompt_tokens_total{model}               prompt tokens prefilled
    lmforge_generated_tokens_total{model}            tokens generated
    lmforge_queue_length{model}                      requests waiting for a batch row
    lmforge_batch_size{model}                        requests in the running batch (rows in use)
    lmforge_decode_steps_total{model}                batched decode steps (one forward each)
    lmforge_decode_rows_total{model}                 rows those steps decoded (over the steps: the mean batch size)
    lmforge_generations_total{model,reason}          generations ended: stop, length, cancelled, timeout, error
    lmforge_inference_flops_total{model}             analytic FLOPs of the completed requests
    lmforge_device_seconds_total{model}              their device-seconds (each request's wall span)
    lmforge_energy_joules_total{model}               their energy (device-seconds x power, estimated)
    lmforge_co2e_grams_total{model}                  their CO2e
    lmforge_cost_dollars_total{model}                their price in US dollars

Each app gets its own registry, so several servers (tests) can live in one process.

Example:
    >>> m = Metrics()
    >>> m.observer("gpt")("batch", 3)
    >>> b"lmforge_batch_size{model=\\"gpt\\"} 3.0" in m.render()
    True
"""

from __future__ import annotations

from collections.abc import Callable


class Metrics:
    """The server's counters, gauges and histograms (see the module docstring)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram  # optional dependency (serve)

        self.registry = r = CollectorRegistry()
        self.requests = Counter("lmforge_requests", "requests answered", ["endpoint", "status"], registry=r)
        self.latency = Histogram("lmforge_request_seconds", "request latency", ["endpoint"], registry=r)
        self.ttft = Histogram("lmforge_time_to_first_token_seconds", "time to the first generated token", ["model"],
                              registry=r)
        self.prompt_tokens = Counter("lmforge_prompt_tokens", "prompt tokens prefilled", ["model"], registry=r)
        self.generated = Counter("lmforge_generated_tokens", "tokens generated", ["model"], registry=r)
        self.queue = Gauge("lmforge_queue_length", "requests waiting for a batch row", ["model"], registry=r)
        self.batch = Gauge("lmforge_batch_size", "requests in the running batch", ["model"], registry=r)
        self.steps = Counter("lmforge_decode_steps", "batched decode steps", ["model"], registry=r)
        self.rows = Counter("lmforge_decode_rows", "rows decoded by the batched decode steps", ["model"], registry=r)
        self.finished = Counter("lmforge_generations", "generations ended, by reason", ["model", "reason"], registry=r)
        # the price tag of the requests (lmforge.cost.inference.request_price), one counter per field
        self.price = {key: Counter(name, text, ["model"], registry=r) for key, name, text in (
            ("flops", "lmforge_inference_flops", "analytic FLOPs of completed requests"),
            ("device_s", "lmforge_device_seconds", "device-seconds of completed requests"),
            ("energy_j", "lmforge_energy_joules", "energy of completed requests, joules"),
            ("co2e_g", "lmforge_co2e_grams", "CO2e of completed requests, grams"),
            ("cost_usd", "lmforge_cost_dollars", "price of completed requests, US dollars"))}

    def add_price(self, model: str, price: dict) -> None:
        """Count one request's price (the ``usage.price`` of its response)."""
        for key, counter in self.price.items():
            counter.labels(model).inc(price[key])

    def observer(self, model: str) -> Callable[[str, object], None]:
        """The ``observe`` callback of one model's scheduler."""

        def observe(event: str, value) -> None:
            if event == "queue":
                self.queue.labels(model).set(value)
            elif event == "batch":
                self.batch.labels(model).set(value)
            elif event == "tokens":  # one decode step over ``value`` rows
                self.steps.labels(model).inc()
                self.rows.labels(model).inc(value)
            elif event == "finished":
                job = value
                self.prompt_tokens.labels(model).inc(len(job.ids))
                self.generated.labels(model).inc(job.generated)
                if job.first_token_at is not None:
                    self.ttft.labels(model).observe(job.first_token_at - job.submitted)
                self.finished.labels(model, job.reason or "error").inc()

        return observe

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
