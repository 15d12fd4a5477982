"""Build a wheelhouse for an offline node: on a machine with network, download the wheels of the project's
dependencies (pyproject.toml) for the node's Python and platform, everything but what the node builds itself
(torch, torch-npu, triton, transformers), then carry the folder over and install from it:

    python scripts/wheelhouse.py --dest wheelhouse            # here: pydantic, rich, ... and their needs
    python scripts/wheelhouse.py --dest wheelhouse --extra fla --extra dev    # + FLA, the tests' plugins
    python -m pip install --no-index --find-links wheelhouse -e .    # on the node: bench and its needs

The folder also holds pyproject's build-system requirements (hatchling, what it needs for an editable
build, and their dependencies, listed in requirements-build.txt), so that `pip install -e .` builds the
project there with every index off and installs the `bench` command. Each extra gets a requirements file of
its own (requirements-fla.txt, requirements-dev.txt): FLA goes into a folder apart from the tests'
environment (docs/clusters.md says why and how). What the node builds itself is never downloaded: a
dependency that would pull torch, triton or transformers in stops the download, naming it.

Defaults fit a typical GPU node (CPython 3.12, x86-64 manylinux); --python and --platform change them. pip
resolves each requirement's own dependencies for that target; packages the node already has are skipped at
install. Needs Python 3.11+ (tomllib) and pip here, nothing of the project's.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    sys.exit("error: scripts/wheelhouse.py needs Python 3.11 or newer (tomllib) on the connected machine")

ROOT = Path(__file__).resolve().parents[1]
NODE_BUILDS = {"torch", "torch-npu", "triton", "transformers", "ruff"}
"""What the node brings in its own build (matched to its CUDA or CANN), or is not needed there (ruff)."""
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
"""pip matches a platform tag exactly: the common x86-64 glibc tags, newest first."""
EDITABLE_BUILD_REQUIRES = {"hatchling.build": ["editables"]}
"""What a build backend asks for, beyond pyproject's build-system requirements, to build an editable
install (PEP 660's get_requires_for_build_editable; hatchling's is `editables`): pip fetches it for
`pip install -e`."""


def requirement_name(requirement: str) -> str:
    """The distribution name of a requirement string ("pydantic>=2.11" -> "pydantic"), normalised."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot read a package name from requirement {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: dict, extras: list[str]) -> dict[str, list[str]]:
    """Requirement file name -> its requirements: `requirements.txt` the project's dependencies,
    `requirements-<extra>.txt` each extra's not already listed, `requirements-build.txt` the build
    backend's (pyproject's build-system); NODE_BUILDS left out, file order kept."""
    project = pyproject["project"]
    groups = project.get("optional-dependencies", {})
    unknown = [e for e in extras if e not in groups]
    if unknown:
        raise SystemExit(f"error: unknown extra {unknown[0]!r}; pyproject.toml has {', '.join(groups)}")
    seen = set(NODE_BUILDS)
    files: dict[str, list[str]] = {}
    system = pyproject.get("build-system", {})
    build = [*system.get("requires", []), *EDITABLE_BUILD_REQUIRES.get(system.get("build-backend", ""), [])]
    for file, listed in [
        ("requirements.txt", project["dependencies"]),
        *[(f"requirements-{e}.txt", groups[e]) for e in extras],
        ("requirements-build.txt", build),
    ]:
        files[file] = []
        for requirement in listed:
            name = requirement_name(requirement)
            if name not in seen:
                seen.add(name)
                files[file].append(requirement.split(";")[0].split("#")[0].strip())
    return files


def node_builds_excluded(dest: Path) -> Path:
    """A pip constraints file in `dest` that no version of NODE_BUILDS satisfies (`torch<0`): pip then stops
    with a conflict naming the package that needs one, instead of downloading a build for another machine
    (PyPI's torch for the node's Python is a CUDA build of gigabytes)."""
    path = dest / "constraints-node-builds.txt"
    path.write_text("".join(f"{name}<0\n" for name in sorted(NODE_BUILDS)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", default="wheelhouse", help="the folder to fill (default: wheelhouse)")
    parser.add_argument("--extra", action="append", default=[], help="an optional-dependency group too")
    parser.add_argument("--python", default="3.12", help="the node's Python version (default 3.12)")
    parser.add_argument(
        "--platform", action="append", help="the node's platform tags (default: x86-64 manylinux)"
    )
    args = parser.parse_args(argv)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = requirements(pyproject, args.extra)
    wanted = [r for listed in files.values() for r in listed]
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:"]
    command += ["--python-version", args.python, "--implementation", "cp"]
    command += ["--constraint", str(node_builds_excluded(dest))]
    for tag in args.platform or PLATFORMS:
        command += ["--platform", tag]
    try:
        subprocess.run([*command, *wanted], check=True)
    except subprocess.CalledProcessError:
        excluded = ", ".join(sorted(NODE_BUILDS))
        sys.exit(
            "error: pip could not fill the wheelhouse (its reason above); a conflict with a constraint such "
            f"as `torch<0` means a requirement depends on what the node brings itself ({excluded}): drop it "
            "or install it on the node with the node's own build"
        )
    for file, listed in files.items():
        (dest / file).write_text("".join(f"{r}\n" for r in listed))
    print(f"{len(wanted)} requirements and their dependencies in {dest}/; on the node (docs/clusters.md):")
    print(f"  python -m pip install --no-index --find-links {dest} -e .    # bench, its needs, the command")
    for file in files:
        if file in ("requirements.txt", "requirements-build.txt"):
            continue  # installed by the line above (the build backend inside pip's build environment)
        target = " --target .fla-site" if file == "requirements-fla.txt" else ""
        print(f"  python -m pip install --no-index --find-links {dest}{target} -r {dest}/{file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
