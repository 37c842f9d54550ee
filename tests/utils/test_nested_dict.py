from hybridflow.utils.nested_dict import leaf_items


def test_leaves_with_dotted_paths():
    tree = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": {}, "f": None, 3: {"g": "x"}}
    # an empty dict is a leaf, a list is a value, keys become strings
    assert list(leaf_items(tree)) == [("a.b", 1), ("a.c.d", [1, 2]), ("e", {}), ("f", None), ("3.g", "x")]
    assert dict(leaf_items({"a": {"b": 1}}, sep="/")) == {"a/b": 1}
    assert dict(leaf_items({"b": 1}, prefix="root")) == {"root.b": 1}
    assert list(leaf_items(5)) == [("", 5)]
