# Source it (`. benchmarks/namespace.sh`) from the repository root: the suite's folders are the packages of one
# namespace, gqa_decode_fuzz (`pip install -e .` maps it); where this checkout is not the one installed (an image
# without network, or an older checkout beside an installed one), a folder of links to pyproject's package-dir
# maps it, first on PYTHONPATH.
if ! python3 -c 'import os, sys, gqa_decode_fuzz.runner as r; sys.exit(os.path.realpath(r.__path__[0]) != os.path.realpath("runner"))' 2>/dev/null; then
  namespace=$(mktemp -d)
  mkdir -p "$namespace/gqa_decode_fuzz"
  for package in $(python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].values())'); do
    ln -s "$PWD/$package" "$namespace/gqa_decode_fuzz/$package"
  done
  export PYTHONPATH=$namespace${PYTHONPATH:+:$PYTHONPATH}
fi
