"""Per-rank helpers shared by the actor and the critic: forward passes over padded batches
(``logprob``) and micro-batching with correct gradient accumulation (``micro_batches``)."""
