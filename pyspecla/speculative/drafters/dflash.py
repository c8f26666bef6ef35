"""DFlashDrafter: the DFlash block-diffusion draft model proposing a whole block per step."""

from __future__ import annotations

from .vocabulary import check_draft_vocab, reduced_vocabulary


class DFlashDrafter:
    """The DFlash block-diffusion draft: one native call per step proposes top_k tokens for each
    of the block's depths. The target context must capture the draft's target layers.

    Reduced vocabulary (vocab = n, `--draft-vocab`): the block is scored over the target head's
    first n ids, control tokens and the generation's own tokens only (draft_vocab.py; the loop
    keeps `history`); log-probs are then over that set. None or 0: the whole head."""

    def __init__(self, draft, n_ctx: int = 4096, vocab: int | None = None, recorded_steps: bool = True):
        check_draft_vocab(vocab)
        self.draft = draft
        self.capture_layers = list(draft.target_layer_ids)
        self.max_depth = int(draft.hparams.block_size) - 1
        self.context = draft.new_context(n_ctx=n_ctx, recorded_steps=recorded_steps)
        self.vocabulary = reduced_vocabulary(draft.target_model, self.context, vocab)
        if self.vocabulary is not None:
            self.history: list[int] = []  # set by the loop: prompt + emitted tokens

    def propose(self, target_ctx, root_token: int, n_depths: int, top_k: int):
        if self.vocabulary is not None:
            self.vocabulary.follow(self.history)
            top_k = min(top_k, len(self.vocabulary))
        return self.context.propose(target_ctx, root_token, min(n_depths, self.max_depth), top_k)
