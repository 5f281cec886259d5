"""A neural-network playground in the spirit of TensorFlow Playground, on workbench graphs.

- :mod:`~workbench.widgets.playground.model`: :class:`PlaygroundModel`, the network as a
  workbench graph, trained step by step (no front end needed);
- :mod:`~workbench.widgets.playground.drawing`: its pictures, as PNG and SVG;
- :mod:`~workbench.widgets.playground.app`: :class:`Playground`, the ipywidgets app.

>>> from workbench.widgets.playground import Playground, PlaygroundModel
"""

from workbench.widgets.playground.app import Playground
from workbench.widgets.playground.drawing import boundary_image, loss_svg, png
from workbench.widgets.playground.model import Options, PlaygroundModel

__all__ = ["Options", "Playground", "PlaygroundModel", "boundary_image", "loss_svg", "png"]
