module github.com/skiff-dev/skiff

go 1.26.8

require github.com/google/btree v1.1.3
