"""The speculative step: `loop` (draft -> tree -> verify -> accept, one loop for every mode), `tree`
(DDTree and chains from a drafter's per-depth top-K), `accept` (the greedy accept walk), `guard`
(sizes a model-free drafter's steps by measured costs), `drafters/` (one file per drafter),
`factory` (a --draft value -> drafter and loop configuration), and the SpecLA pieces driven from
Python: `hld` (the tree's schedule) and `recurrent` (factor banks, tree conv and GDN verify)."""
