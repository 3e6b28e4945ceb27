# Source it (`. benchmarks/namespace.sh`) from the repository root: the suite's folders are the packages of one
# namespace, gqa_decode_fuzz (`pip install -e .` maps it); where the checkout is not installed (an image without
# network), a folder of links to pyproject's package-dir maps it, on PYTHONPATH.
if ! python3 -c 'import gqa_decode_fuzz.runner' 2>/dev/null; then
  namespace=$(mktemp -d)
  mkdir -p "$namespace/gqa_decode_fuzz"
  for package in $(python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].values())'); do
    ln -s "$PWD/$package" "$namespace/gqa_decode_fuzz/$package"
  done
  export PYTHONPATH=$namespace${PYTHONPATH:+:$PYTHONPATH}
fi
