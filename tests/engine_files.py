"""Engine files edited for a test: one field's line replaced, then loaded fresh."""

from autoconfig.inference import engine as engines


def load_with_field(tmp_path, monkeypatch, name: str, field: str, value: str):
    """Engine ``name`` loaded from a copy of its file in ``tmp_path`` whose
    ``field`` line holds ``value`` (YAML text) with a test source; the engine
    cache is cleared before and after, so no other test sees the copy."""
    text = (engines.engines_dir() / f"{name}.yaml").read_text()
    lines = [f'{field}: {{value: {value}, source: "test"}}' if line.startswith(f"{field}:")
             else line for line in text.splitlines()]
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(engines, "engines_dir", lambda: tmp_path)
    engines._load.cache_clear()
    try:
        return engines._load(str(path))
    finally:
        engines._load.cache_clear()
