"""After pretraining: finetuning and alignment of a small GPT (notebook 13, "After pretraining").

Built on `helpers.text`, `helpers.model` and `helpers.training`; nothing below imports it.

    tasks     arithmetic in words ("what is three plus four?" -> "seven") with an exact checker  nb 13 s1
    classify  a classification head on the last token, and which weights to train          nb 13 s2
    lora      LoRALinear (lora_A, lora_B, scaling = alpha / r, merge), named as in peft      nb 13 s3
    recipe    the notebook's setting (task, pretraining, SFT batches) for its benchmark  nb 13
    sft       the chat template, the answer-only loss mask, answers' log-probabilities      nb 13 s4
    dpo       the DPO loss from its formula, implicit rewards, KL to the reference          nb 13 s5
    grpo      group-normalised advantages, the clipped ratio, the k3 KL, a GRPO step        nb 13 s6
"""
