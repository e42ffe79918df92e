"""The tests, one folder per floor of the package (``project``: checks of the whole project).

Packages, so that two folders may hold files of one name and a test may import another's helpers as
``tests.<floor>.<module>``."""
