"""Verification of candidate μGraphs against their spec: exact finite-field random tests, float
differential tests, the formal proof (`mugraph.verify.abstract`), and mutation testing."""
from mugraph.verify.check import (VerificationReport, check, interface_mismatch, quick_equivalent,
                                   quick_rejection, rejection)
from mugraph.verify.finite_field import (FF_ELEMENTWISE, UNINTERPRETED, Field,
                                         FiniteFieldResult, FiniteFieldSemantics, degree_bound,
                                         finite_field_test, pair_bound)
from mugraph.verify.float_diff import FloatResult, ModeResult, float_diff
from mugraph.verify.mutate import (KillRates, Mutant, MutantSet, generate_mutants, kill_rates,
                                   mutants, rewrite)

__all__ = ["FF_ELEMENTWISE", "UNINTERPRETED", "Field", "FiniteFieldResult", "FiniteFieldSemantics",
           "FloatResult", "KillRates", "ModeResult", "Mutant", "MutantSet", "VerificationReport",
           "check", "degree_bound", "finite_field_test", "float_diff", "generate_mutants",
           "interface_mismatch", "kill_rates", "mutants", "pair_bound", "quick_equivalent",
           "quick_rejection", "rejection", "rewrite"]
