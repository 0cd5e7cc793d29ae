"""Thin Ray adapters (Train, Data, Tune, index building). No science here."""
