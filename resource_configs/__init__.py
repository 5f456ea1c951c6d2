"""RADICAL-Pilot resource configs shipped with trajflow (JSON files beside this one)."""
