"""What a model's gradients, routing and outputs show: the gradient-flow report, routing statistics,
the figures and pictures drawn from them, and the studies' figures. Functions of models, arrays and
reports; it imports ``capsnet``, never ``app``."""
from .gradflow import gradient_flow_report, mean_of_reports
from .routing_statistics import routing_statistics

__all__ = ["gradient_flow_report", "mean_of_reports", "routing_statistics"]
