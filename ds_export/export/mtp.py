"""The MTP draft (DeepSeek-V3's next-n prediction layer) as a Paddle Layer with its own latent cache.

`MTPDraft(weights, max_len)`: forward(input_ids [B, S], hidden [B, S, H], cache_lens [B],
cache [1, B, max_len, D]) -> (logits [B, S, V] float32, hidden_out [B, S, H] float32, new cache).

Convention (shared/formats.md section 1): draft position t pairs token t+1 with the base
model's hidden state at t (after the base model's final norm):

    x      = eh_proj(concat(enorm(embed(token[t+1])), hnorm(h_base[t])))     (embedding first)
    x      = one full decoder layer (MLA + MoE, its own latent cache, rope position t)
    h_out  = shared_head.norm(x)
    logits = shared_head.head(h_out)       -> the prediction of token t+2

So a caller passes input_ids = tokens[:, 1:] and hidden = h_base[:, :-1], and cache_lens counts
draft positions already cached (position t's row sits at cache index t). `hidden_out` (after
shared_head.norm, like the base model's output and transformers' MtpLayer) is what a chained
draft step feeds back as its next `hidden`. The draft uses its own embed_tokens and head
(layer num_hidden_layers of the checkpoint); the math of the decoder layer is modeling.py's.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle.static import InputSpec

from ds_export.errors import DsxError
from ds_export.export.modeling import (DecoderLayer, LatentCacheStep, RMSNorm, _param, check_step, embed_tokens,
                                       make_linear, step_tensors)
from ds_export.export.tp import gather_last_dim
from ds_export.export.weights import ModelWeights


class MTPDraft(LatentCacheStep):
    num_cache_layers = 1

    def __init__(self, weights: ModelWeights, max_len: int, layer: int = 0):
        if not 0 <= layer < len(weights.mtp):
            raise DsxError(f"MTP layer {layer}: the weights hold {len(weights.mtp)} MTP layer(s) "
                           "(num_nextn_predict_layers; load with include_mtp=True)")
        super().__init__(weights, max_len)
        lw, dt = weights.mtp[layer], weights.dtype
        t = lw.tensors
        self.embed = _param(self, t["mtp_embed"])  # [V, H]
        self.enorm = RMSNorm(t["mtp_enorm"], self.spec.eps, dt)
        self.hnorm = RMSNorm(t["mtp_hnorm"], self.spec.eps, dt)
        self.eh_proj = make_linear(t["mtp_eh_proj"], dt)  # [2H, H]
        self.block = DecoderLayer(self.spec, lw)
        self.head_norm = RMSNorm(t["mtp_head_norm"], self.spec.eps, dt)
        self.head = make_linear(t["mtp_head"], dt)  # [H, V]

    def forward(self, input_ids, hidden, cache_lens, cache):
        st = step_tensors(input_ids, cache_lens, self.rope_cos, self.rope_sin)
        e = self.enorm(embed_tokens(input_ids, self.embed, self.spec))
        x = self.eh_proj(paddle.concat([e, self.hnorm(hidden.astype("float32"))], axis=-1))
        x, c = self.block(x, st, cache[0])
        h = self.head_norm(x)
        return gather_last_dim(self.head(h), self.spec.tp_world), h, paddle.stack([c])  # (no fp16 unsqueeze on CPU)

    def input_spec(self) -> list:
        """InputSpecs of forward for `paddle.jit.save` (batch and new-token count dynamic)."""
        return [InputSpec([None, None], "int64", "input_ids"),
                InputSpec([None, None, self.spec.hidden], "float32", "hidden"),
                InputSpec([None], "int64", "cache_lens"),
                InputSpec([1, None, self.max_len, self.cache_width], self.dtype_name, "cache")]

    def step(self, input_ids, hidden, cache_lens, cache):
        """Dygraph convenience: checks the inputs, runs forward without autograd."""
        check_step(input_ids, cache_lens, cache, layers=1, max_len=self.max_len, width=self.cache_width,
                   what="MTP draft step")
        ids = np.asarray(input_ids)
        if list(hidden.shape) != [ids.shape[0], ids.shape[1], self.spec.hidden]:
            want = [ids.shape[0], ids.shape[1], self.spec.hidden]
            raise DsxError(f"MTP draft step: hidden shape {list(hidden.shape)}, expected {want} "
                           "(the base model's hidden at positions t for tokens t+1)")
        with paddle.no_grad():
            return self.forward(paddle.to_tensor(ids.astype(np.int64)), paddle.to_tensor(hidden),
                                paddle.to_tensor(np.asarray(cache_lens, dtype=np.int64)), cache)
