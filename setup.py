"""Which packages the wheel holds; everything else about the project is in pyproject.toml.

The three layers live at the top of the repository (spec/, proofs/, impl/: the design
puts them first) and install as subpackages of ``kvbound``; the tool's own packages are
found under kvbound/. Packages are found, not listed, so a new one (kvbound/trace/,
spec/foo/) ships without an edit here; tests/test_packaging.py checks the wheel.
"""

from setuptools import find_packages, setup

# top-level directory -> the package it installs as (docs/architecture.md)
LAYERS = {"spec": "kvbound.spec", "proofs": "kvbound.proofs", "impl": "kvbound.impl"}

packages = find_packages(include=["kvbound", "kvbound.*"])
package_dir = {"kvbound": "kvbound"}
for directory, name in LAYERS.items():
    package_dir[name] = directory
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(directory)]

setup(packages=packages, package_dir=package_dir)
