module github.com/fluksio/fluksio-worker

go 1.26.8

require github.com/BurntSushi/toml v1.6.0
