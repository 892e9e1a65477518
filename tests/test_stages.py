"""What every stage kind module defines: the one interface the rest of the tuner reads a kind through."""
from __future__ import annotations

import pytest

from tuner.chain.kinds import KINDS
from tuner.sync.policies import INDEX_MAP_NAMES

INTERFACE = ("HEADER", "TILE_TEMPLATE", "REGIONS", "PER_COLUMN", "PADS_ROWS", "env", "tiling_problem", "smem_bytes",
             "partial_floats", "template_constants", "a_arg", "b_operand", "block_work", "reference", "cupy_stage", "torch_input",
             "torch_weight", "torch_stage", "torch_output", "check_shapes", "reads", "chunk_columns")


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_defines_the_whole_interface(name):
    module = KINDS[name]
    assert [k for k in INTERFACE if not hasattr(module, k)] == []


@pytest.mark.parametrize("name", KINDS)
def test_every_region_of_an_index_map_names_exactly_the_policies_names(name):
    regions = KINDS[name].REGIONS
    assert regions and all(set(r) == set(INDEX_MAP_NAMES) for r in regions)


@pytest.mark.parametrize("name", KINDS)
def test_a_kinds_template_and_header_exist(name):
    from tuner.paths import templates_dir

    module = KINDS[name]
    assert (templates_dir() / module.TILE_TEMPLATE).is_file()
    assert module.HEADER is None or (templates_dir() / module.HEADER).is_file()
