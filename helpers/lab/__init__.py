"""The lab bench: what only the notebooks use, never the model, training or scale code.

    setup_cell   the set-up cell's text: finds the course's helpers/, or installs it  every nb
    environment  what the set-up cell calls: seeds, device, figure style               every nb
    plots        projector-friendly figures, labelled heat maps, loss curves         every nb
    widgets      Explorer: controls that redraw a figure, with a static fallback     nb 1-9
    exercises    checked exercises with hints, one module per notebook               every nb
    own_text     your own text: read a UTF-8 file, train the BPE and a GPT on it     nb 1, 7
    notes_tables the tables the lecture notes print, read from data/notes_tables.txt  nb 3, 7
    sections     catch_up: start at any section after a restart; refuse_untrained   every nb
"""
