"""The Python face of a loaded qwen35 model: `Model.load(path)` → logits, generation (greedy or
sampled; the streaming Generation is generation.py's), tokenization. Weights stay in the GGUF's
memory map; the native library reads them in place."""

from __future__ import annotations

import ctypes
from typing import Callable, Iterator, Sequence

import numpy as np

from . import _native
from .errors import GGUFError, UsageError
from .generation import SPECULATIVE_OPTIONS, Generation, start_generation
from .loader.target import ModelFile
from .logit_rows import apply_logit_rows
from .sampling import SamplingParams, TokenSampler
from .token_ids import token_id_array


class Context:
    """One sequence's native state (KV cache, conv windows, GDN states). Create with
    `Model.new_context()`. One native call per forward chunk of at most `max_batch` tokens."""

    def __init__(self, model: "Model", n_ctx: int, max_batch: int, n_threads: int, cpu_kernels: str,
                 max_tree_nodes: int = 0, verify_method: str = "hld_chains", commit_method: str = "deferred_factors",
                 capture_layers=None, device: str = "auto", recorded_steps: bool = True):
        if n_ctx <= 0:
            raise UsageError(f"n_ctx must be positive, got {n_ctx}")
        if n_ctx > 2**31 - 1:  # (max_tokens of a few billion) it would wrap to a negative int32
            raise UsageError(f"n_ctx {n_ctx} is too large (positions are int32; ask for fewer tokens)")
        self.model = model
        self.n_ctx = n_ctx
        self.max_batch = min(max_batch, n_ctx)
        self.max_tree_nodes = max_tree_nodes
        self.recorded_steps = recorded_steps  # a draft context made for this one follows it (bench_gpu_e2e)
        kernels = _native.CPU_KERNELS.get(cpu_kernels)
        if kernels is None:
            raise UsageError(f"cpu_kernels must be one of {sorted(_native.CPU_KERNELS)}, got {cpu_kernels!r}")
        if verify_method not in _native.VERIFY_METHODS:
            raise UsageError(f"verify_method must be one of {sorted(_native.VERIFY_METHODS)}, got {verify_method!r}")
        if commit_method not in _native.COMMIT_METHODS:
            raise UsageError(f"commit_method must be one of {sorted(_native.COMMIT_METHODS)}, got {commit_method!r}")
        self.capture_layers = np.ascontiguousarray(np.asarray(capture_layers or [], dtype=np.int32))
        try:
            backend, index = _native.parse_device(device)
        except ValueError as e:
            raise UsageError(str(e)) from None
        params = _native.ContextParams(
            n_ctx, self.max_batch, n_threads, kernels, max_tree_nodes, _native.VERIFY_METHODS[verify_method],
            _native.COMMIT_METHODS[commit_method], len(self.capture_layers),
            _native.int32_ptr(self.capture_layers) if len(self.capture_layers) else None, backend, index,
            0 if recorded_steps else 1,
        )
        handle = ctypes.c_void_p()
        _native.check(_native.lib.specla_context_create(model._handle, ctypes.byref(params), ctypes.byref(handle)))
        self._handle = handle
        self._argmax = np.zeros(self.max_batch, dtype=np.int32)  # reused by every forward
        self.logit_tokens: np.ndarray | None = None  # token id of each logit entry; None = all, in id order

    @property
    def device(self) -> str:
        """The backend this context resolved to: 'cpu' or 'cuda'."""
        return _native.BACKEND_NAMES[_native.lib.specla_context_backend(self._handle)]

    @property
    def n_past(self) -> int:
        return _native.lib.specla_context_n_past(self._handle)

    def reset(self) -> None:
        _native.check(_native.lib.specla_context_reset(self._handle))

    def truncate(self, n_past: int) -> None:
        """Forget the tokens at positions >= n_past, exactly (as if only the first n_past had been
        evaluated). A model with recurrent layers (qwen35) can only go back to the position of its
        last save_state() (else NativeError): their state folds every token together."""
        _native.check(_native.lib.specla_context_truncate(self._handle, int(n_past)))

    def save_state(self) -> None:
        """Remember the recurrent state at the current position (one slot), so truncate() can come
        back to it: one copy of the conv windows and GDN states (nothing for qwen2)."""
        _native.check(_native.lib.specla_context_save_state(self._handle))

    @property
    def n_logits(self) -> int:
        """Entries of a logits row: n_vocab, or the rows chosen by set_logit_rows."""
        return self.model.hparams.n_vocab if self.logit_tokens is None else len(self.logit_tokens)

    def set_logit_rows(self, token_ids) -> None:
        """Score logits over the LM head rows of token_ids only (a draft's reduced vocabulary; see
        specla_context_set_logit_rows). Afterwards eval's logits have len(token_ids) entries in that
        order, and eval_argmax, verify_tree and stream give token ids. None: the whole head again."""
        self.logit_tokens = apply_logit_rows(_native.lib.specla_context_set_logit_rows, self._handle,
                                             self.model.hparams.n_vocab, token_ids)

    def token_of(self, index: int) -> int:
        """The token id of logit entry `index`."""
        return int(index) if self.logit_tokens is None else int(self.logit_tokens[index])

    def close(self) -> None:
        if getattr(self, "_handle", None):
            _native.lib.specla_context_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def _forward(self, tokens: np.ndarray, logits_all: bool, logits: np.ndarray | None, want_argmax: bool) -> None:
        n = len(tokens)
        positions = np.arange(self.n_past, self.n_past + n, dtype=np.int32)
        batch = _native.Batch(
            _native.int32_ptr(tokens),
            _native.int32_ptr(positions),
            n,
            1 if logits_all else 0,
            _native.float_ptr(logits) if logits is not None else None,
            _native.int32_ptr(self._argmax) if want_argmax else None,
        )
        _native.check(_native.lib.specla_forward(self._handle, ctypes.byref(batch)))

    def eval(self, token_ids: Sequence[int], logits_all: bool = False) -> np.ndarray:
        """Append tokens (chunked by max_batch). Returns logits: (n_tokens, V) when logits_all,
        else (V,) for the last token; V = n_logits (n_vocab unless set_logit_rows chose rows)."""
        tokens = token_id_array(token_ids, "eval: token ids")
        V = self.n_logits
        out = np.empty((len(tokens), V) if logits_all else (V,), dtype=np.float32)
        for start in range(0, len(tokens), self.max_batch):
            chunk = tokens[start : start + self.max_batch]
            last_chunk = start + self.max_batch >= len(tokens)
            if logits_all:
                self._forward(chunk, True, out[start : start + len(chunk)], False)
            elif last_chunk:
                self._forward(chunk, False, out.reshape(1, V), False)
            else:
                self._forward(chunk, False, None, False)
        return out

    # --- speculative decoding -------------------------------------------------------------------
    def verify_tree(self, tokens, parents, want_logits: bool = False):
        """One forward over a tree [root, nodes...] (node i at position n_past + depth). Returns the
        target's argmax at every node (and the logits when asked). Commits nothing: call accept()."""
        tokens = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))
        parents = np.ascontiguousarray(np.asarray(parents, dtype=np.int32))
        n = len(tokens)
        if n == 0 or len(parents) != n:
            raise UsageError("verify_tree needs as many parents as tokens (at least one)")
        argmax = np.empty(n, dtype=np.int32)
        logits = np.empty((n, self.n_logits), dtype=np.float32) if want_logits else None
        batch = _native.TreeBatch(_native.int32_ptr(tokens), _native.int32_ptr(parents), n, 0,
                                  _native.float_ptr(logits) if logits is not None else None, _native.int32_ptr(argmax))
        _native.check(_native.lib.specla_verify_tree(self._handle, ctypes.byref(batch)))
        if self.logit_tokens is not None:
            argmax = self.logit_tokens[argmax]
        return (argmax, logits) if want_logits else argmax

    def accept(self, path) -> None:
        """Commit the accepted path of the last verified tree (node ids from the root 0)."""
        path = np.ascontiguousarray(np.asarray(path, dtype=np.int32))
        _native.check(_native.lib.specla_accept_path(self._handle, _native.int32_ptr(path), len(path)))

    def finish(self) -> None:
        """finish_speculative_state: fold the pending path into the durable state (idempotent)."""
        _native.check(_native.lib.specla_context_finish_speculative_state(self._handle))

    @property
    def pending(self) -> int:
        return _native.lib.specla_context_pending(self._handle)

    def sync(self) -> None:
        """Wait until the backend has run every op queued so far (a GPU queues them on a stream).
        For benchmarks timing a call whose results are not read back (accept); generation never
        needs it."""
        _native.check(_native.lib.specla_context_sync(self._handle))

    def launch_counters(self) -> tuple[int, int]:
        """(kernel launches, host waits) of this context's backend since the last call, which resets
        them; (-1, -1) on the CPU, which launches nothing."""
        launches, waits, _ = self.step_counters()
        return launches, waits

    def step_counters(self) -> tuple[int, int, int]:
        """(launches, host waits, kernels run) since the last call of this or launch_counters, which
        resets all three: a step run op by op launches each of its kernels, a recorded step is one
        launch that runs all of them. (-1, -1, -1) on the CPU."""
        launches, waits, kernels = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        _native.check(_native.lib.specla_context_step_counters(self._handle, ctypes.byref(launches),
                                                               ctypes.byref(waits), ctypes.byref(kernels)))
        return launches.value, waits.value, kernels.value

    def tree_stats(self) -> dict:
        """What the last verify_tree did in the recurrent layers (specla_tree_stats): n_nodes,
        n_layers, and node_steps / state_copies of value head 0 summed over them. SpecLA steps each
        node once per layer; all zeros for a model without recurrent layers."""
        out = _native.TreeStats()
        _native.check(_native.lib.specla_context_tree_stats(self._handle, ctypes.byref(out)))
        return out.as_dict()

    def read_features(self, first: int, n: int) -> np.ndarray:
        """Captured feature rows of committed positions [first, first + n): (n, n_capture, n_embd)."""
        out = np.empty((n, len(self.capture_layers), self.model.hparams.n_embd), dtype=np.float32)
        _native.check(_native.lib.specla_context_read_features(self._handle, first, n, _native.float_ptr(out)))
        return out

    def prefill(self, token_ids: Sequence[int], want_logits: bool = False,
                on_progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None):
        """Append tokens in chunks of at most max_batch. Returns the last token's logits row (V,)
        when want_logits, else its greedy next token (no logits copied). should_stop() is asked
        before every chunk: when it answers True, returns None, the chunks before it evaluated.
        on_progress(done, total) is called after each chunk."""
        tokens = token_id_array(token_ids, "prefill: token ids")
        # the last row's logits come back even for a greedy next token: one look at them per
        # generation tells a file whose weights hold NaN or Inf from a model that chose token 0
        logits = np.empty((1, self.n_logits), dtype=np.float32)
        for start in range(0, len(tokens), self.max_batch):
            if should_stop is not None and should_stop():
                return None
            chunk = tokens[start : start + self.max_batch]
            last_chunk = start + self.max_batch >= len(tokens)
            self._forward(chunk, False, logits if last_chunk else None, last_chunk and not want_logits)
            if on_progress is not None:
                on_progress(start + len(chunk), len(tokens))
        if not np.isfinite(logits).all():
            raise GGUFError(f"{self.model.file.path}: the logits after the prompt are not finite (NaN or "
                            f"infinite): the file's weights may hold NaN or Inf values")
        return logits[0] if want_logits else self.token_of(self._argmax[0])

    def eval_argmax(self, token_ids: Sequence[int], on_progress: Callable[[int, int], None] | None = None) -> int:
        """Append tokens and return the greedy next token (no logits copied to Python).
        on_progress(done, total) is called after each chunk of at most max_batch tokens."""
        tokens = token_id_array(token_ids, "eval_argmax: token ids")
        for start in range(0, len(tokens), self.max_batch):
            chunk = tokens[start : start + self.max_batch]
            last_chunk = start + self.max_batch >= len(tokens)
            self._forward(chunk, False, None, last_chunk)
            if on_progress is not None:
                on_progress(start + len(chunk), len(tokens))
        return self.token_of(self._argmax[0])


class Model:
    """A qwen35 model loaded from a GGUF file (memory-mapped; CPU backend). A context manager:
    `with Model.load(path) as model:` closes it at the end; a closed model says so when used."""

    def __init__(self, file: ModelFile, n_threads: int = 0, cpu_kernels: str = "auto", device: str = "auto"):
        try:
            _native.parse_device(device)
        except ValueError as e:
            raise UsageError(str(e)) from None
        self.file = file
        self.hparams = file.hparams
        self.n_threads = n_threads
        self.cpu_kernels = cpu_kernels
        self.device = device
        self._tokenizer = None
        hp = file.hparams
        self._recurrent = (ctypes.c_uint8 * hp.n_layer)(*[1 if r else 0 for r in hp.layer_is_recurrent])
        self._hparams_struct = _native.HParams(
            hp.n_layer, hp.n_embd, hp.n_ff, hp.n_vocab, hp.n_head, hp.n_head_kv, hp.head_dim, hp.rope_dims,
            hp.rope_freq_base, hp.rms_eps, hp.ssm_conv_kernel, hp.ssm_state_size, hp.ssm_group_count,
            hp.ssm_time_step_rank, hp.n_ctx_train, _native.ARCHS[getattr(hp, "arch", "qwen35")], self._recurrent,
        )
        layers = (_native.LayerWeights * hp.n_layer)()
        for il in range(hp.n_layer):
            for field in _native.LAYER_FIELDS:
                # the file knows its architecture's names (qwen2: ffn_norm is the pre-FFN norm)
                name = file.layer_tensor_name(il, field)
                view = file.optional_tensor(name) if name else None
                if view is not None:
                    setattr(layers[il], field, self._tensor(view))
        output = file.optional_tensor("output.weight")
        self._lm_head = output if output is not None else file.tensor("token_embd.weight")  # tied when absent
        self._weights = _native.Weights(
            self._tensor(file.tensor("token_embd.weight")),
            self._tensor(file.tensor("output_norm.weight")),
            self._tensor(output) if output is not None else _native.Tensor(),
            layers,
        )
        self._layers = layers
        handle = ctypes.c_void_p()
        _native.check(
            _native.lib.specla_model_create(
                ctypes.byref(self._hparams_struct), ctypes.byref(self._weights), ctypes.byref(handle)
            )
        )
        self._handle = handle

    @staticmethod
    def _tensor(view) -> _native.Tensor:
        ne0 = int(view.ne[0])
        ne1 = int(np.prod(view.ne[1:])) if len(view.ne) > 1 else 1
        return _native.tensor_struct(view.data, view.ggml_type, ne0, ne1)

    @classmethod
    def load(cls, path, n_threads: int = 0, cpu_kernels: str = "auto", device: str = "auto") -> "Model":
        """Open and validate a qwen35 / qwen2 / qwen3 GGUF. Raises GGUFError naming the file and the
        culprit. device: where its contexts run — 'auto' (a GPU when this build and machine have a
        working one, else the CPU), 'cpu', 'cuda' or 'cuda:N'; the weights go to a GPU when the first
        context there is created."""
        if cpu_kernels not in _native.CPU_KERNELS:
            raise UsageError(f"cpu_kernels must be one of {sorted(_native.CPU_KERNELS)}, got {cpu_kernels!r}")
        return cls(ModelFile.open(path), n_threads=n_threads, cpu_kernels=cpu_kernels, device=device)

    def close(self) -> None:
        if getattr(self, "_handle", None):
            _native.lib.specla_model_free(self._handle)
            self._handle = None

    def __del__(self):
        self.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return not getattr(self, "_handle", None)

    def new_context(self, n_ctx: int = 4096, max_batch: int = 64, max_tree_nodes: int = 0,
                    verify_method: str = "hld_chains", commit_method: str = "deferred_factors",
                    capture_layers=None, recorded_steps: bool = True) -> Context:
        """A fresh sequence. max_tree_nodes > 0 enables tree verification (SpecLA by default:
        HLD chains + deferred factor commit; the other methods are the baselines). On a GPU a
        decode step is recorded once and replayed (recorded_steps=False runs every op eagerly;
        the results are the same bits)."""
        if self.closed:
            raise UsageError(f"model {self.file.path} is closed")
        return Context(self, n_ctx, max_batch, self.n_threads, self.cpu_kernels, max_tree_nodes=max_tree_nodes,
                       verify_method=verify_method, commit_method=commit_method, capture_layers=capture_layers,
                       device=self.device, recorded_steps=recorded_steps)

    # --- convenience API -------------------------------------------------------------------
    def logits(self, token_ids: Sequence[int], max_batch: int = 64) -> np.ndarray:
        """Logits (n_tokens, n_vocab) of every position, from a fresh context."""
        tokens = token_id_array(token_ids, "logits: token ids")
        ctx = self.new_context(n_ctx=len(tokens), max_batch=max_batch)
        try:
            return ctx.eval(tokens, logits_all=True)
        finally:
            ctx.close()

    # Keyword options of generate(draft=...): the `pyspecla run` flags of the same name
    # (--specla, --ddtree-budget, ...) with their command-line defaults.
    SPECULATIVE_OPTIONS = SPECULATIVE_OPTIONS

    def generation(self, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams | None = None,
                   draft=None, stop_at_eos: bool = True, logprobs: int = 0, *, token_logprobs: bool = False,
                   n_ctx: int | None = None, on_prefill: Callable[[int, int], None] | None = None,
                   **speculative_options) -> Generation:
        """Start generating up to max_tokens tokens after prompt_ids; returns a Generation, an
        iterator of GeneratedToken(id, logprob, top_logprobs) with cancel(), stats and
        finish_reason (see help(pyspecla.generation.Generation)). Arguments are checked, the draft
        loaded and the context made here; tokens are computed as the iteration asks for them.

        sampling      a SamplingParams (pyspecla.sampling): None or temperature 0 is greedy.
                      Sampling draws the token at sequence position p with a random number keyed
                      by (seed, p), so a given seed gives the same tokens with or without a draft.
        draft         None: plain decoding. Otherwise exact speculative decoding — the very tokens
                      plain decoding gives, greedy or sampled — usually in fewer target steps:
                        a path: a DFlash draft GGUF for this model, or a small language model
                          (qwen2/qwen35) with this model's vocabulary;
                        "ngram" or "ngram:n=N,max=M": prompt lookup, no draft model;
                        "oracle:p=P": a benchmark tool (it first decodes plainly to know the answer);
                        a drafter object: propose(ctx, root_token, n_depths, top_k) -> (tokens,
                          logprobs), both (depths, top_k), like pyspecla.speculative.drafters'.
        stop_at_eos   stop after the first end-of-generation token (it is yielded).
        logprobs      N > 0: each token also lists the N most likely alternatives (top_logprobs).
        token_logprobs  greedy only: also give each token's logprob with logprobs = 0 (this copies
                      the logits, which the greedy path otherwise never does).
        n_ctx         the context's size in tokens (default prompt + max_tokens; at least that).
        on_prefill    on_prefill(done, total) after each chunk of the prompt pass.
        speculative_options  `pyspecla run`'s speculative flags as keywords, same names and
                      defaults: specla (bool: SpecLA tree verify through the recurrent layers),
                      no_ddtree (bool: top-1 chain only), ddtree_budget, ddtree_tau, specla_top_k,
                      no_chain_seed, and for a draft language model draft_max, draft_p_min,
                      draft_vocab.

            gen = model.generation(ids, 64, SamplingParams(temperature=0.7, seed=1), draft="ngram")
            for token in gen:
                print(token.id, token.logprob)
            print(gen.finish_reason, gen.stats["accepted_per_step"])
        """
        return start_generation(self, prompt_ids, max_tokens, sampling=sampling, draft=draft,
                                stop_at_eos=stop_at_eos, logprobs=logprobs, options=speculative_options,
                                token_logprobs=token_logprobs, n_ctx=n_ctx, on_prefill=on_prefill)

    def generate(self, token_ids: Sequence[int], max_tokens: int, stop_at_eos: bool = False, draft=None,
                 sampling: SamplingParams | None = None, **options) -> list[int]:
        """The ids of a whole generation (see generation() for draft, sampling and options):
        up to max_tokens new ids (with stop_at_eos, up to and including the first end-of-generation
        token). Greedy by default; with a draft, the very tokens plain decoding gives.

            model.generate(ids, 64, draft="draft.gguf", specla=True)
            model.generate(ids, 64, draft="ngram", sampling=SamplingParams(temperature=0.8, seed=3))
        """
        with self.generation(token_ids, max_tokens, sampling=sampling, draft=draft, stop_at_eos=stop_at_eos,
                             **options) as generation:
            return [token.id for token in generation]

    def stream(
        self,
        token_ids: Sequence[int],
        max_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
        context: Context | None = None,
        on_prefill: Callable[[int, int], None] | None = None,
        sampling: SamplingParams | None = None,
    ) -> Iterator[int]:
        """Yield new token ids one by one, plain decoding: greedy at temperature 0, else sampled
        (pyspecla.sampling; temperature and seed are shorthands for sampling=SamplingParams(...),
        give one or the other). context: decode in this context (it is left open), else a fresh one.
        on_prefill(done, total) reports the prompt pass chunk by chunk."""
        from .generation import PlainStats, plain_steps, resolve_sampling

        if sampling is not None and (temperature != 0.0 or seed is not None):
            raise UsageError("stream: give either sampling= or temperature/seed, not both")
        if sampling is None:
            sampling = SamplingParams(temperature=temperature, seed=seed)
        params = resolve_sampling(sampling)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
            raise UsageError(f"max_tokens must be an integer >= 0, got {max_tokens!r}")
        prompt = token_id_array(token_ids, "the prompt's token ids").tolist()
        ctx = context or self.new_context(n_ctx=len(prompt) + max_tokens + 1)
        eos = self.tokenizer.eos_ids if stop_at_eos else ()
        return self._stream(ctx, context is None, plain_steps(ctx, prompt, max_tokens, PlainStats(),
                                                              sampler=TokenSampler(params), eos_ids=eos,
                                                              on_prefill=on_prefill))

    @staticmethod
    def _stream(ctx, owns_ctx: bool, steps) -> Iterator[int]:
        try:
            for records in steps:
                for record in records:
                    yield record[0]
        finally:
            if owns_ctx:
                ctx.close()

    def chat(self, messages: list[dict], stream: bool = False, max_tokens: int = 512, draft=None,
             chat_template_kwargs: dict | None = None, **fields):
        """Answer a conversation: messages ([{"role": "user", "content": "..."}, ...]) rendered
        with the GGUF's chat template (as `pyspecla run --chat` does), then generated until an
        end-of-generation token or max_tokens.

        Returns the reply's text; with stream=True a Generation yielding text pieces as they are
        decoded (never a partial UTF-8 character; cancel(), stats and finish_reason as usual).
        fields: SamplingParams fields (temperature, top_p, seed, ...) and the speculative options
        generation() takes (specla, ddtree_budget, ...). chat_template_kwargs reach the template as
        variables (tools=..., enable_thinking=False).

            model.chat([{"role": "user", "content": "Hi"}], temperature=0.7, seed=1, draft="ngram")
        """
        from .generation import SPECULATIVE_OPTIONS as spec_names

        names = SamplingParams.field_names()
        unknown = sorted(set(fields) - set(names) - set(spec_names))
        if unknown:
            raise UsageError(f"chat: unknown argument(s) {', '.join(unknown)} (sampling fields: {', '.join(names)}; "
                             f"speculative options: {', '.join(spec_names)})")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise UsageError("chat: messages must be a list of {'role': ..., 'content': ...} dicts")
        sampling = SamplingParams(**{k: v for k, v in fields.items() if k in names})
        options = {k: v for k, v in fields.items() if k in spec_names}
        prompt = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                    **(chat_template_kwargs or {}))
        ids = self.tokenize(prompt)
        if not ids:
            raise UsageError("chat: the conversation renders to no tokens")
        generation = start_generation(self, ids, max_tokens, sampling=sampling, draft=draft, stop_at_eos=True,
                                      options=options, text=True)
        if stream:
            return generation
        with generation:
            return "".join(generation)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from .tokenizer import Tokenizer

            self._tokenizer = Tokenizer.from_gguf_fields(self.file.metadata, self.file.path)
        return self._tokenizer

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise UsageError(f"tokenize expects a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, special=special)

    def detokenize(self, ids: Sequence[int]) -> str:
        ids = list(ids)
        if not ids:
            return ""
        tokens = token_id_array(ids, "detokenize: token ids")
        n_vocab = self.tokenizer.n_vocab
        if tokens.max() >= n_vocab:
            raise UsageError(f"detokenize: token id {int(tokens.max())} outside the vocabulary (0..{n_vocab - 1})")
        return self.tokenizer.decode(tokens.tolist())
