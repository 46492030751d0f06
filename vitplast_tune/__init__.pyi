# The package's public names, read by type checkers and by ``lazy_loader.attach_stub`` in ``__init__.py`` (which
# loads each name's module on first use): this file is the one list of what ``import vitplast_tune`` offers.
from .config import FinetuneConfig as FinetuneConfig
from .errors import DataError as DataError
from .errors import OptionsError as OptionsError
from .errors import ResumeError as ResumeError
from .errors import SearchNotFound as SearchNotFound
from .errors import ServicesError as ServicesError
from .errors import SpaceError as SpaceError
from .errors import UserError as UserError
from .plan.options import SearchOptions as SearchOptions
from .predictors.report import plasticity_report as plasticity_report
from .records.search import Search as Search
from .records.search import list_searches as list_searches
from .records.search import load_search as load_search
from .run.driver import run_search as run_search
from .space.files import load_space as load_space
from .vit.best_model import load_best_model as load_best_model
from .vit.models import create_model as create_model
from .vit.plasticity import compute_plasticity as compute_plasticity
from .vit.training import finetune as finetune

__version__: str
