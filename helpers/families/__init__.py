"""The other two families, and the recurrent model the Transformer replaced (notebook 10).

Built on `helpers.model` (its attention and layers) and `helpers.training` (the loop).

    translation  the generated translation task (English -> Grammish) and its splits
    seq2seq      encoder and decoder layers with cross-attention, beam search
    rnn          the GRU seq2seq without attention (the bottleneck), and with Bahdanau's attention
    bottleneck   joined-sentence examples and the three-model experiment of benchmarks/bench_bottleneck.py
    mlm          masked-language-model pretraining (80/10/10) and a finetuned classifier
"""
