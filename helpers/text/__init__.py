"""Text: turning characters into token ids and back, and the corpora the course trains on.

The bottom of the course (notebook 1); nothing here imports the model.

    chars           character tokenizer and the text checks the tokenizers share      nb 1
    bpe             byte-level BPE, from the textbook loop to the fast trainer        nb 1
    subword         WordPiece and Unigram                                             nb 1
    gpt2_tokenizer  GPT-2's vocab.json + merges.txt as a relabelled course BPE        nb 7
    corpus          the small course corpus (a story grammar) and its checker         nb 1, 2, 10
    lexicon         word stems and English spelling rules (plurals, pasts, -er, un-)  nb 1, 7
    corpus_rich     the rich corpus: tales, dialogues, diaries; its checker           nb 1, 7
"""
