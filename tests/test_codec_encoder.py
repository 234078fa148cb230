"""The codec's Mimi encoder under the published tensor names, whichever layout transformers gives Mimi.

transformers up to 5.20 keeps Mimi as one model (`encoder.layers.*`, `encoder_transformer.*`,
`downsample.*`); 5.21 splits it (`encoder.encoder_seanet.*`, `encoder.encoder_transformer.*`,
`encoder.downsample.*`). The checkpoint is always in the first, published, layout. CI runs this file on
the oldest and the newest transformers; the split-layout test below also runs on either.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

import omnitts
from omnitts.models.codec_encoder import mimi_encoder, published_layout
from omnitts.testing.checkpoint import make_codec_config

pytestmark = pytest.mark.kernels  # CI runs these under every CPU profile (docs/devices.md)

PUBLISHED_PREFIXES = ("encoder.layers.", "encoder_transformer.layers.", "downsample.conv.",
                      "quantizer.semantic_residual_vector_quantizer.", "quantizer.acoustic_residual_vector_quantizer.")


@pytest.fixture(scope="module")
def encoder_config():
    return make_codec_config("tiny-0.6b")["encoder_config"]


def _published_names(mimi: nn.Module) -> list[str]:
    return list(published_layout(mimi).state_dict())


def test_the_installed_layout_shows_the_published_names(encoder_config):
    names = _published_names(mimi_encoder(dict(encoder_config)))
    assert names and all(name.startswith(PUBLISHED_PREFIXES) for name in names), names[:5]
    # Every published group is there: 28 SEANet tensors, 24 transformer tensors, the downsample conv.
    for prefix, count in (("encoder.layers.", 28), ("encoder_transformer.layers.", 24), ("downsample.conv.", 1)):
        assert sum(name.startswith(prefix) for name in names) == count, prefix


def test_a_split_mimi_maps_to_the_same_names(encoder_config):
    """The split layout, assembled from the installed model's own modules, shows the same names in the same
    order, and its view shares the model's tensors (loading into the view loads the model)."""
    one = published_layout(mimi_encoder(dict(encoder_config)))
    split = nn.Module()
    split.encoder = nn.Module()
    split.encoder.encoder_seanet = one.encoder
    split.encoder.encoder_transformer = one.encoder_transformer
    split.encoder.downsample = one.downsample
    split.quantizer = one.quantizer
    view = published_layout(split)
    assert view is not split
    assert list(view.state_dict()) == list(one.state_dict())
    name = next(iter(view.state_dict()))
    view.load_state_dict({**view.state_dict(), name: torch.full_like(view.state_dict()[name], 7.0)}, assign=True)
    assert torch.equal(split.get_submodule("encoder.encoder_seanet").state_dict()[name.split(".", 1)[1]],
                       torch.full_like(view.state_dict()[name], 7.0))


def test_the_loaded_encoder_holds_the_stored_tensors(ckpt_dir):
    """Every tensor of the loaded Mimi is the one stored under its published name (strict load, any layout)."""
    folder = ckpt_dir("base")
    stored = {k[len("encoder."):]: v for k, v in load_file(folder / "speech_tokenizer" / "model.safetensors").items()
              if k.startswith("encoder.")}
    loaded = published_layout(omnitts.load(folder, dtype="float32").ckpt.codec_encoder.mimi).state_dict()
    assert set(loaded) == set(stored)
    for name, tensor in stored.items():
        assert torch.equal(loaded[name], tensor), name
