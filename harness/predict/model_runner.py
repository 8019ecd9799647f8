"""Which of vLLM's two GPU model runners a release gives a model by default.

The second runner (vllm/v1/worker/gpu/model_runner.py, "Model Runner V2") warms the sampler up on a dummy batch
whose requests are greedy, with neither top-k nor top-p, so its profile holds the logits alone (sampler_peak.py).
Which runner a start takes, read in vllm/config/vllm.py `use_v2_model_runner`, `_is_default_v2_model_runner_model`
and `_get_v2_model_runner_unsupported_features`, 0.22.0 … 0.34.0:

- 0.22: Qwen3ForCausalLM; 0.23 also Llama and Mistral; neither an MoE nor a quantized checkpoint;
- 0.24: those, quantized or not, and the MoE DeepseekV2, Qwen2Moe and GraniteMoe;
- 0.25 to 0.28: every generating model but a hybrid (state-space layers) and an MoE model outside that list;
- from 0.29: every model;
- never a launch the second runner does not support: speculative decoding other than EAGLE, EAGLE-3 and MTP.

What the second runner holds that the first does not, read in 0.22.0, 0.24.0, 0.25.1, 0.26.0, 0.27.1, 0.28.0 … 0.31.0
and 0.33.0:

- Per-request sampling state on the last pipeline stage, allocated when the model loads: the penalties' output token
  counts and prompt-token bitmask (sample/penalties.py `PenaltiesState`: `output_bin_counts`, int32 [max_num_reqs,
  vocab], and `prompt_bin_mask`, int32 [max_num_reqs, ⌈vocab / 32⌉]) and the grammar bitmask (structured_outputs.py:
  int32 [max_num_reqs × decode_query_len, ⌈vocab / 32⌉]). They are torch tensors made after the worker's first
  snapshot and outside the weights' window, so the profile missed them until 0.27, which measures what the device
  lost since that snapshot (utils/mem_utils.py `total_consumed`, from `mem_get_info`).
- No CUDA-graph estimate before 0.29: its `profile_cudagraph_memory` returns 0 ("It is TBD whether we keep this API
  or not"), so the graphs are captured out of what the cache leaves, not reserved before it.
"""

from __future__ import annotations

from packaging.version import Version

from harness.predict.speculative import SpeculativeDecoding

SECOND_RUNNER_SINCE = Version("0.22")
ANY_ARCHITECTURE_SINCE = Version("0.25")  # dense models whatever their architecture, and the listed MoE ones
EVERY_MODEL_SINCE = Version("0.29")
QUANTIZED_SINCE = Version("0.24")  # 0.22 and 0.23 kept a quantized checkpoint on the first runner
NAMED = ((Version("0.22"), frozenset({"Qwen3ForCausalLM"})),
         (Version("0.23"), frozenset({"Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"})),
         (Version("0.24"), frozenset({"Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM",
                                      "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})))
MOE_ON_SECOND_RUNNER = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
# The modelled architectures with state-space (Mamba, gated delta net) layers: vLLM's `is_hybrid`.
HYBRID_ARCHITECTURES = frozenset({"JambaForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForConditionalGeneration",
                                  "Qwen3_5MoeForConditionalGeneration"})
SECOND_RUNNER_SPECULATORS = frozenset({"eagle", "eagle3", "mtp"})
SAMPLING_STATE_COUNTED_SINCE = Version("0.27")
GRAPHS_ESTIMATED_SINCE = Version("0.29")
INT32_BYTES = 4
BITMASK_TOKENS_PER_WORD = 32


def runs_second_runner(version: Version, architecture: str | None, moe: bool, quantized: bool,
                       speculative: SpeculativeDecoding | None) -> bool:
    """Whether this start profiles on the second GPU model runner (V1 engine)."""
    if version < SECOND_RUNNER_SINCE or (speculative is not None
                                         and speculative.method not in SECOND_RUNNER_SPECULATORS):
        return False
    if version >= EVERY_MODEL_SINCE:
        return True
    if version >= ANY_ARCHITECTURE_SINCE:
        return architecture not in HYBRID_ARCHITECTURES and (not moe or architecture in MOE_ON_SECOND_RUNNER)
    named = next(names for since, names in reversed(NAMED) if version >= since)
    return architecture in named and (version >= QUANTIZED_SINCE or not (moe or quantized))


def sampling_state_bytes(max_num_reqs: int, vocab: int, speculative: SpeculativeDecoding | None) -> int:
    """The second runner's per-request sampling state on the last stage: token counts and two bitmasks."""
    words = -(-vocab // BITMASK_TOKENS_PER_WORD)
    decode_query_len = 1 + (speculative.num_speculative_tokens if speculative is not None else 0)
    return INT32_BYTES * max_num_reqs * (vocab + words + words * decode_query_len)


def reserves_graph_estimate(version: Version, second_runner: bool) -> bool:
    """Whether a release's runner estimates its CUDA graphs before the cache (0.21 on; the second runner from 0.29)."""
    return not second_runner or version >= GRAPHS_ESTIMATED_SINCE
