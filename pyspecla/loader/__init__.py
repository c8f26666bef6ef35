"""Opening GGUF files: `target` (ModelFile: a qwen35, qwen2 or qwen3 model) and `dflash`
(DraftFile: a DFlash draft, and the check that it belongs to a target). Each puts the container
checks of pyspecla.gguf_container together with the rules of its architecture in pyspecla.arch."""
