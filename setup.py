# The cffi extension is declared here because setuptools has no pyproject key for cffi_modules.
from setuptools import setup

setup(cffi_modules=["duckpipe/_native_build.py:ffibuilder"])
