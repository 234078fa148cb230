"""Ascend NPUs via torch_npu: NPU graphs and deferred copies, as the CUDA backend does, plus the
code predictor's attention as one fused kernel over a fixed-shape frame cache.

`torch_npu` is imported only when this backend is chosen (without the CANN toolkit it breaks
`import torch`). Not yet run on real hardware in this project (no NPU on our machines); the call
contract is checked on the CPU against a stub torch_npu (tests/test_predictor_cache.py).
"""

from __future__ import annotations

import os
import warnings

import torch

from ..errors import OmniTTSError
from .accelerator import AcceleratorBackend


def torch_npu_mismatch(torch_version: str, npu_version: str) -> str | None:
    """Why a torch_npu release cannot run on this torch, or None. Each torch_npu release is built for
    exactly one torch release line (2.14.0 for torch 2.14.*, 2.12.0.post3 for 2.12.0, ...): a pair whose
    major.minor differ fails inside `import torch_npu` with errors that do not name the cause."""
    line = ".".join(torch_version.split("+")[0].split(".")[:2])
    npu_line = ".".join(npu_version.split(".")[:2])
    if line == npu_line:
        return None
    return (f"torch_npu {npu_version} is built for torch {npu_line}, but torch is {torch_version}: install the "
            f"matching pair, e.g. pip install \"omnitts[npu]\" \"torch=={line}.*\" (keeps torch, picks its "
            f"torch_npu) or pip install \"torch_npu=={line}.*\"")


def import_torch_npu(given: str = "--device npu"):
    """Import torch_npu (it registers torch.npu), or raise OmniTTSError naming `given` (the flag the NPU was
    asked with)."""
    from importlib import metadata

    try:
        mismatch = torch_npu_mismatch(torch.__version__, metadata.version("torch_npu"))
    except metadata.PackageNotFoundError:
        mismatch = None  # not installed (or vendored without metadata): the import below says so
    if mismatch:
        raise OmniTTSError(f"{given}: {mismatch}")
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # ImportError, or the CANN toolkit's own errors
        raise OmniTTSError(
            f"{given} needs torch_npu and the Ascend CANN toolkit ({type(exc).__name__}: {exc}); "
            "install them (pip install 'omnitts[npu]', then source CANN's set_env.sh) or use --device cpu"
        ) from None
    if not torch.npu.is_available():
        raise OmniTTSError(f"{given}: torch_npu is installed but no NPU is visible")


# SoCs whose documentation lists `npu_fusion_attention` and bfloat16 matrix products: the Atlas A2 training
# series (Ascend910B*), Atlas A3 (Ascend910_93*) and Ascend950. Elsewhere (Ascend310P inference cards, the
# first Ascend910) `auto` means float16 and the code predictor attends with torch's sdpa.
FUSED_SOCS = ("Ascend910B", "Ascend910_93", "Ascend950")


def soc_name() -> str:
    """The NPU's SoC name as torch_npu reports it (e.g. "Ascend910B3"); "" where it cannot tell."""
    try:
        return str(torch.npu.get_device_name(torch.npu.current_device()))
    except Exception:  # torch_npu missing or too old to say: treated as an unknown part
        return ""


def fused_attention_supported(name: str) -> bool:
    return name.startswith(FUSED_SOCS)


def auto_dtype() -> str:
    """What `--dtype auto` means on this NPU: bfloat16 on A2-class parts and later, else float16."""
    return "bfloat16" if fused_attention_supported(soc_name()) else "float16"


class FusionAttention:
    """`torch_npu.npu_fusion_attention` as an attention kernel `(q, k, v, mask, causal) -> out`.

    Meant for `models.kv_cache.StaticKVCache`: q (B, N, T, D) against all S positions of the fixed
    K/V buffers (B, Nkv, S, D), with a boolean (1, 1, T, S) mask (True = attend). Every call of a
    frame has the same shapes and no per-call lengths (`actual_seq_qlen/kvlen` stay unset), so a
    captured NPU graph replays it without parameter updates.

    What this relies on, from the torch_npu API reference ("torch_npu.npu_fusion_attention",
    hiascend.com Ascend Extension for PyTorch 6.0.0, ptaoplist_000850) and torch_npu's meta
    registration (Ascend/pytorch, torch_npu/meta/_meta_registrations.py):
      - signature `(query, key, value, head_num, input_layout, *, pse=None, padding_mask=None,
        atten_mask=None, scale=1., keep_prob=1., pre_tockens=2147483647, next_tockens=2147483647,
        inner_precise=0, prefix=None, actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0,
        gen_mask_parallel=True, sync=False)`; `head_num` = query heads; layouts BSH, SBH, BSND, BNSD;
      - it returns a 7-tuple (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset,
        numels); attention_out (element 0) has the query's shape and layout;
      - `atten_mask` is bool with True = masked out (the opposite of torch's sdpa), shaped BNSS, B1SS,
        11SS or SS (S = Sq x Skv), so our mask is inverted before the call;
      - `sparse_mode=0` ("defaultMask") applies the given mask as is (pre/next_tockens at their
        defaults do not restrict it); 2/3 are compressed left-up/right-down causal masks meant for
        Sq = Skv prefill, which is not our shape (Sq = 1 or 2 against Skv = G);
      - grouped-query attention: key/value may have fewer heads than the query when the query's
        count is a multiple of theirs (Huawei Cloud ModelArts "NPU_Flash_Attn融合算子约束"; MindSpore's
        speed_fusion_attention, the same kernel: "N2 must be a factor of N1"), so K/V are not repeated;
      - dtypes float16 / bfloat16 / float32 (6.0.0; CANN 7.0's page lists only float16 / bfloat16)
        on Atlas A2 training-series devices.
    """

    def __init__(self):
        import torch_npu  # registered by the backend's import_torch_npu (or a test's stub)

        self.op = torch_npu.npu_fusion_attention

    def __call__(self, q, k, v, mask, causal):
        assert mask is not None and not causal, "the fused predictor kernel needs the static cache's explicit mask"
        out = self.op(q, k, v, q.shape[1], input_layout="BNSD", atten_mask=~mask, scale=q.shape[-1] ** -0.5,
                      sparse_mode=0)
        return out[0]


class NpuBackend(AcceleratorBackend):
    name = "npu"

    def __init__(self, eager: bool = False):
        import_torch_npu()
        super().__init__(eager=eager)
        if not self.eager and os.environ.get("TASK_QUEUE_ENABLE") == "2":
            # Many Ascend guides export level 2; NPU graph capture refuses to run under it.
            warnings.warn("omnitts: TASK_QUEUE_ENABLE=2 makes NPU graph capture fail, so frames run eagerly; export "
                          "TASK_QUEUE_ENABLE=1 for graphs (recipes/ascend-910b.toml sets it)", RuntimeWarning,
                          stacklevel=2)
            self.eager = True

    def new_graph(self, fn, restore, output, inputs):
        return torch.npu.NPUGraph()

    def predictor_attention(self) -> FusionAttention | None:
        """The fused kernel, run over the code predictor's fixed-shape frame cache, on the parts its
        documentation lists; elsewhere None (torch's sdpa over the growing frame cache), with a warning."""
        name = soc_name()
        if fused_attention_supported(name):
            return FusionAttention()
        warnings.warn(f"omnitts: npu_fusion_attention is documented for Atlas A2-class NPUs ({', '.join(FUSED_SOCS)}); "
                      f"this one is {name or 'unknown'}, so the code predictor attends with torch's sdpa",
                      RuntimeWarning, stacklevel=2)
        return None
