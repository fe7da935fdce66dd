"""Names for whole setups, derived from SWITCHES:
a variant name is the norm position, "+token" for each switch away from its default,
then "-<norm type>" (pre+qk_head-rmsnorm, mix0.5+depth-layernorm).
norm_variant() writes it, variant_fields() reads it,
for --variant, the runner and the reports alike."""

import re

from model.model_minimind import SWITCH, SWITCHES, config_problem, norms_added, with_implied
from model.norms import NORM_TYPES

# The fields a variant name speaks of:
# the norm type, the position, and every switch with a name token.
VARIANT_SWITCHES = ("norm_type", "norm_position", *(s.name for s in SWITCHES if s.token))
VARIANT_DEFAULTS = {name: getattr(with_implied({}), name) for name in VARIANT_SWITCHES}
QKV = {"qk_norm": "head", "v_norm": "head"}  # "+qkv": per-head norms on q, k and v
# Each name token and the fields it sets
TOKENS = {"qkv": QKV} | {token: {switch.name: value}
                         for switch in SWITCHES if isinstance(switch.token, dict)
                         for value, token in switch.token.items()}
# Setups best known by the recipe that uses them.
# nanochat: parameter-free RMSNorm before each sublayer, per head on q and k,
# after the embedding lookup and before lm_head, logits soft-capped at 15.
RECIPES = {"nanochat": "pre+qk_head+embed_norm+softcap15-rmsnorm_noparam"}
PRESETS = {
    # MiniMind2-small: the default config, and the CUDA run's model
    "minimind2-small": {"hidden_size": 512, "num_hidden_layers": 8,
                        "num_attention_heads": 8, "num_key_value_heads": 2},
    # MiniMind-3 as its repository ships it (2026):
    # per-head QK-norm, eps 1e-6, FFN ceil(pi * 768 / 64) * 64
    "minimind3": {"hidden_size": 768, "num_hidden_layers": 8,
                  "num_attention_heads": 8, "num_key_value_heads": 4,
                  "qk_norm": "head", "rms_norm_eps": 1e-6, "intermediate_size": 2432},
}


def norm_variant(config) -> str:
    """A config's variant name:
    'pre-rmsnorm', 'pre+depth+qk_head-rmsnorm', 'rezero', 'nanochat'."""
    parts = [config.norm_position]
    if (config.norm_position == "mix"
            and config.mix_ln_fraction != SWITCH["mix_ln_fraction"].default):
        parts[0] += f"{config.mix_ln_fraction:g}"
    # what the placement sets without a token
    implied = with_implied({"norm_position": config.norm_position})
    qkv = all(getattr(config, f) == v != getattr(implied, f) for f, v in QKV.items())
    for switch in SWITCHES:
        value = getattr(config, switch.name)
        if (not switch.token or value == getattr(implied, switch.name)
                or (qkv and switch.name == "v_norm")):
            continue
        if isinstance(switch.token, str):  # a number, e.g. softcap15
            parts.append(f"{switch.token}{value:g}")
        else:
            parts.append("qkv" if qkv and switch.name == "qk_norm"
                         else switch.token[value])
    name = "+".join(parts)
    # ReZero has norms only where a switch adds them; with none, no type
    if config.norm_position != "rezero" or norms_added(config):
        name += f"-{config.norm_type}"
    return next((recipe for recipe, spelled in RECIPES.items() if spelled == name), name)


def variant_fields(name: str) -> dict:
    """The config fields a variant name sets
    (every variant switch: the ones it does not name at their defaults);
    ValueError naming the part that is not one."""
    name = RECIPES.get(name, name)
    placement, _, norm = name.rpartition("-") if "-" in name else (name, "", "none")
    if norm not in NORM_TYPES:
        raise ValueError(f"variant {name!r}: {norm!r} is not a norm type; "
                         f"allowed: {sorted(NORM_TYPES)}")
    position, *tokens = placement.split("+")
    fields = dict(VARIANT_DEFAULTS, norm_type=norm)
    mix = re.fullmatch(r"mix([0-9.]+)", position)
    if mix:
        position = "mix"
        fields["mix_ln_fraction"] = number_in(name, mix[1], float)
    if position not in SWITCH["norm_position"].choices:
        raise ValueError(f"variant {name!r}: {position!r} is not a norm position; "
                         f"allowed: {list(SWITCH['norm_position'].choices)}, "
                         f"or a whole name: {list(RECIPES)}")
    fields["norm_position"] = position
    # HybridNorm's QKV-norm: its name says so without a token
    implied = with_implied({"norm_position": position})
    fields |= {field: getattr(implied, field) for field in QKV}
    # the fields the tokens set: one may not undo another (pre+qk_head+qk_proj)
    named = set()
    for token in tokens:
        number = next((s for s in SWITCHES if isinstance(s.token, str)
                       and re.fullmatch(rf"{s.token}[0-9.e+-]+", token)), None)
        if number:
            sets = {number.name: number_in(name, token.removeprefix(number.token), number.type)}
        elif token in TOKENS:
            sets = TOKENS[token]
        else:
            raise ValueError(
                f"variant {name!r}: {token!r} is not a part of a variant name; "
                f"allowed: {sorted(TOKENS)} and softcap<C>")
        if twice := named & sets.keys():
            raise ValueError(f"variant {name!r}: {token!r} "
                             f"sets {', '.join(twice)} a second time")
        named |= sets.keys()
        fields |= sets
    # "pre" alone would be pre-none, a model without a norm;
    # ReZero has norms to name a type for only where its tokens add them
    if "-" not in name and (position != "rezero" or norms_added(with_implied(fields))):
        none = f" ({name}-none has no norms)" if not variant_problem(f"{name}-none") else ""
        raise ValueError(f"variant {name!r} names no norm type; name one: {name}-rmsnorm, "
                         f"{name}-layernorm, ...{none}")
    return fields


def number_in(name: str, text: str, kind: type):
    """A variant name's number (mix0.25, softcap15), or a ValueError naming it."""
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"variant {name!r}: {text!r} is not a number") from None


def variant_problem(name: str) -> str | None:
    """Why the name makes no model to train
    (not every placement pairs with every norm), or None."""
    try:
        fields = variant_fields(name)
    except ValueError as err:
        return str(err)
    return config_problem(with_implied(fields), training=True)
