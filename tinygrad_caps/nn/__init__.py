"""Neural-network building blocks: Module, Parameter, layers, and ``nn.init``."""
from . import init
from .layers import (BatchNorm1d, BatchNorm2d, Conv2d, ConvTranspose2d, Dropout, Flatten, LeakyReLU, Linear, ReLU,
                     Sequential, Sigmoid, Tanh)
from .module import Module, Parameter

__all__ = ["BatchNorm1d", "BatchNorm2d", "Conv2d", "ConvTranspose2d", "Dropout", "Flatten", "LeakyReLU", "Linear",
           "Module", "Parameter", "ReLU", "Sequential", "Sigmoid", "Tanh", "init"]
