"""Serving a trained model: the inference engine of notebook 14 ("Serving the model").

    sampling     temperature, top-k, top-p, min-p as transformations of the next-token
                 distribution; sampling with a generator the caller owns          nb 14, section 1
    batching     prompts of different lengths in one batch: left padding, attention mask,
                 position ids; the row-wise forward every engine here runs       nb 14, section 2
    paged        the paged KV cache: blocks, block tables, a free pool, copy on write
                                                                                 nb 14, sections 3, 5
    scheduler    continuous batching (waiting and running queues) against static batching
                                                                                 nb 14, section 4
    speculative  speculative decoding: a draft proposes, the target checks, the accept/reject
                 rule with the residual distribution, and its exact output distribution
                                                                                 nb 14, section 6
    quantize     weight-only int8 per channel and int4 per group (packed two per byte)
                                                                                 nb 14, section 7

serve imports from text, model and training only; nothing here imports lab.
"""
