"""The smallest valid pipeline file (two generations on the digits), shared by the config tests."""

VALID = """\
name: t
data: {source: digits}
generations:
  - name: g0
    method: {name: hbct, params: {clip: 1.0}}
    classes: {first_fraction: 0.5}
  - name: g1
    parent: g0
    method: {name: hbct, params: {lam: 0.3}}
"""
