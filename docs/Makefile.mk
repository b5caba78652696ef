EXTRA_DIST += docs
