"""The exercise checkers' tests, one file per module of helpers/lab/exercises/ (test_<module>.py).

A package, unlike the other test folders: its files share their names with the modules they mirror,
and four of those names (test_attention, test_embeddings, test_gpt, test_layers) are tests/model's too;
as a package they import as exercises.test_attention and do not collide. Shared pieces: judging.py.
"""
