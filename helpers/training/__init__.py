"""Training: the loop that fits a model, and the machinery that makes it fast (notebook 7).

Built on `helpers.model`; the model never imports it.

    by_hand  the training step's core pieces in plain code: next_token_loss, adamw_update, HandAdamW
    trainer  batches, the learning-rate schedule, the Trainer and its History
    guards   the Trainer's checks: its inputs, the learning rate, non-finite weights
    speed    bfloat16 working copy, one buffer for every weight, fused AdamW, compile
    muon     Muon by hand (Newton-Schulz, momentum, the shape's learning-rate scale), paired with AdamW
    resume   save a run of any model and optimizer, and resume it exactly (notebook 11)
"""
