"""The optional C extension ``rocketray.wire._records`` (the record loops of wire/batch.py and
broker/batch.py).

Everything else is declared in pyproject.toml. The extension links ISA-L's CRC-32 when its headers
are installed (Debian: ``libisal-dev``), else zlib's. It is optional: without a C compiler the
install still succeeds and the batch modules run their pure-Python loops (``RECORDS_IMPLEMENTATION``
says which one runs; the store-append and produce-allack benchmarks print it).
"""

from __future__ import annotations

import os

from setuptools import Extension, setup


def _records_extension() -> Extension:
    isal = os.path.exists("/usr/include/isa-l/crc.h") and os.environ.get("ROCKETRAY_CRC", "") != "zlib"
    return Extension(
        "rocketray.wire._records",
        sources=["wire/_records.c"],
        define_macros=[("RR_HAVE_ISAL", "1")] if isal else [],
        libraries=["isal"] if isal else ["z"],
        extra_compile_args=["-O2", "-std=c11", "-Wall"],
        optional=True,
    )


setup(ext_modules=[_records_extension()])
