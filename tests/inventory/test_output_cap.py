"""The output cap each request is sent with is the one its fit against the server's context is checked with."""

from __future__ import annotations

import pytest

from harness.errors import FieldError, HarnessError
from harness.inventory.build import build_token_id_inventory
from harness.inventory.check import check_fits
from harness.inventory.frozen import Inventory, TokenIdRecipe, VocabularyRange
from harness.inventory.output_cap import effective_output_cap_tokens, longest_output_cap_tokens


@pytest.fixture(scope="module")
def inventory() -> Inventory:
    recipe = TokenIdRecipe(vocabulary=VocabularyRange(low=10, high=1000), prompt_tokens=[100, 300],
                           output_cap_tokens=[200, 250], seed=0)
    return build_token_id_inventory("caps", recipe)


def test_max_tokens_replaces_every_prompts_cap_above_or_below_it(inventory: Inventory) -> None:
    assert [effective_output_cap_tokens(p, None) for p in inventory.prompts] == [200, 250]
    assert [effective_output_cap_tokens(p, 64) for p in inventory.prompts] == [64, 64]
    assert [effective_output_cap_tokens(p, 400) for p in inventory.prompts] == [400, 400]
    assert (longest_output_cap_tokens(inventory, None), longest_output_cap_tokens(inventory, 64)) == (250, 64)


def test_a_max_tokens_below_the_caps_that_fits_is_not_refused(inventory: Inventory) -> None:
    # max_model_len 512: the inventory's caps need 100+200=300 and 300+250=550 > 512, refused;
    # --max-tokens 64 needs 100+64=164 and 300+64=364 <= 512: it fits, and is not refused.
    with pytest.raises(HarnessError, match=r"1 prompt\(s\) exceed max_model_len 512 \(prompt \+ output cap tokens\): "
                                           r"p0001 \(300\+250=550\)$"):
        check_fits(inventory, 512)
    check_fits(inventory, 512, max_tokens=64)


def test_a_max_tokens_that_does_not_fit_is_refused_naming_the_field(inventory: Inventory) -> None:
    # --max-tokens 300 is above both caps: 100+300=400 fits 512, 300+300=600 does not.
    with pytest.raises(FieldError) as refused:
        check_fits(inventory, 512, max_tokens=300)
    assert refused.value.field == "max_tokens"
    assert str(refused.value) == ("max_tokens: inventory caps: 1 prompt(s) exceed max_model_len 512 "
                                  "(prompt + max_tokens 300 tokens): p0001 (300+300=600)")
    # --max-tokens 213: 300+213 = 513, one token over
    with pytest.raises(FieldError, match=r"p0001 \(300\+213=513\)$"):
        check_fits(inventory, 512, max_tokens=213)
    check_fits(inventory, 512, max_tokens=212)  # 300+212 = 512 exactly fits
