"""Filled by later work; see README."""
