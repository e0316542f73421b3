// Package dist is how the processes of a data-parallel job find each other: who each one is
// (its rank), the meeting that hands every rank NCCL's unique id, and the launcher that starts
// one process per local GPU.
//
// In: torchrun's conventions — RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT in the environment (FromEnv), or the launch flags --gpus, --nnodes, --node-rank,
// --master-addr, --master-port (Flags). Out: a Config; a Session holding the id from rank 0
// (Rendezvous) and watching that every rank stays alive; or, from Launch, the local ranks run
// to their end.
//
// Why a package of its own, and TCP: NCCL leaves the exchange of its unique id to the program
// (PyTorch uses a TCP store, llm.c a TCP or file exchange — no MPI). Rank 0 listens at
// MASTER_ADDR:MASTER_PORT; the other ranks connect, rank 0 checks that they agree on the job
// (world size, distinct ranks) and, once all have arrived, sends the id to each. Every wait is
// bounded and its error names the rank or the address. The connections stay open for the rest
// of the run: a rank whose process dies closes its connection, and the others learn which
// rank it was (Session.Done), since real NCCL would wait for it forever. The package knows
// nothing of NCCL: the id is bytes.
package dist

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// The environment variables torchrun sets, which a rank reads.
const (
	EnvRank           = "RANK"
	EnvWorldSize      = "WORLD_SIZE"
	EnvLocalRank      = "LOCAL_RANK"
	EnvLocalWorldSize = "LOCAL_WORLD_SIZE"
	EnvNodeRank       = "GROUP_RANK"
	EnvMasterAddr     = "MASTER_ADDR"
	EnvMasterPort     = "MASTER_PORT"
)

// Config is where one process stands in a job.
type Config struct {
	Rank, WorldSize int
	// LocalRank is the rank among this node's processes: the GPU the process uses.
	LocalRank, LocalWorldSize int
	// NodeRank is the node's rank among the job's nodes (torchrun's GROUP_RANK).
	NodeRank int
	// MasterAddr:MasterPort is where rank 0 listens for the others.
	MasterAddr string
	MasterPort int
}

// Addr is MasterAddr:MasterPort.
func (c Config) Addr() string { return net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort)) }

// FromEnv reads a rank's Config from the environment as torchrun (or Launch) sets it. ok is
// false when neither RANK nor WORLD_SIZE is set: a process of its own, not part of a job.
// Errors name the variable and its value.
func FromEnv(getenv func(string) string) (cfg Config, ok bool, err error) {
	if getenv(EnvRank) == "" && getenv(EnvWorldSize) == "" {
		return Config{}, false, nil
	}
	ints := []struct {
		name     string
		dst      *int
		required bool
	}{
		{EnvRank, &cfg.Rank, true},
		{EnvWorldSize, &cfg.WorldSize, true},
		{EnvLocalRank, &cfg.LocalRank, false},
		{EnvLocalWorldSize, &cfg.LocalWorldSize, false},
		{EnvNodeRank, &cfg.NodeRank, false},
		{EnvMasterPort, &cfg.MasterPort, false},
	}
	for _, v := range ints {
		s := getenv(v.name)
		if s == "" {
			if v.required {
				return Config{}, false, fmt.Errorf("%s is not set but %s=%q is: a rank of a job needs both", v.name, other(v.name), getenv(other(v.name)))
			}
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return Config{}, false, fmt.Errorf("%s=%q: not an integer", v.name, s)
		}
		*v.dst = n
	}
	cfg.MasterAddr = getenv(EnvMasterAddr)
	if cfg.WorldSize > 1 {
		if cfg.MasterAddr == "" || getenv(EnvMasterPort) == "" {
			return Config{}, false, fmt.Errorf("%s=%d but %s or %s is not set: every rank needs rank 0's address", EnvWorldSize, cfg.WorldSize, EnvMasterAddr, EnvMasterPort)
		}
		if getenv(EnvLocalRank) == "" {
			return Config{}, false, fmt.Errorf("%s=%d but %s is not set: it says which of this node's GPUs the rank uses (torchrun sets it)", EnvWorldSize, cfg.WorldSize, EnvLocalRank)
		}
	}
	return cfg, true, cfg.validate()
}

func other(name string) string {
	if name == EnvRank {
		return EnvWorldSize
	}
	return EnvRank
}

// validate checks the numbers' ranges; its errors use the environment's names.
func (c Config) validate() error {
	switch {
	case c.WorldSize < 1:
		return fmt.Errorf("%s=%d: there must be at least 1 rank", EnvWorldSize, c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return fmt.Errorf("%s=%d is not in [0, %s=%d)", EnvRank, c.Rank, EnvWorldSize, c.WorldSize)
	case c.LocalRank < 0:
		return fmt.Errorf("%s=%d: negative", EnvLocalRank, c.LocalRank)
	case c.NodeRank < 0:
		return fmt.Errorf("%s=%d: negative", EnvNodeRank, c.NodeRank)
	case c.LocalWorldSize < 0:
		return fmt.Errorf("%s=%d: negative", EnvLocalWorldSize, c.LocalWorldSize)
	case c.LocalWorldSize > 0 && c.LocalRank >= c.LocalWorldSize:
		return fmt.Errorf("%s=%d is not in [0, %s=%d)", EnvLocalRank, c.LocalRank, EnvLocalWorldSize, c.LocalWorldSize)
	case c.WorldSize > 1 && (c.MasterPort < 1 || c.MasterPort > 65535):
		return fmt.Errorf("%s=%d: not a TCP port (1 to 65535)", EnvMasterPort, c.MasterPort)
	}
	return nil
}

// Environ returns base with the variables of c set (any old values removed): the environment
// of the process that is c's rank.
func (c Config) Environ(base []string) []string {
	set := map[string]string{
		EnvRank:           strconv.Itoa(c.Rank),
		EnvWorldSize:      strconv.Itoa(c.WorldSize),
		EnvLocalRank:      strconv.Itoa(c.LocalRank),
		EnvLocalWorldSize: strconv.Itoa(c.LocalWorldSize),
		EnvNodeRank:       strconv.Itoa(c.NodeRank),
		EnvMasterAddr:     c.MasterAddr,
		EnvMasterPort:     strconv.Itoa(c.MasterPort),
	}
	return setEnv(base, set)
}

// setEnv returns base without the variables of set, then set's, in a stable order.
func setEnv(base []string, set map[string]string) []string {
	env := make([]string, 0, len(base)+len(set))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, replaced := set[name]; !replaced {
			env = append(env, kv)
		}
	}
	for _, name := range []string{EnvRank, EnvWorldSize, EnvLocalRank, EnvLocalWorldSize, EnvNodeRank, EnvMasterAddr, EnvMasterPort} {
		if v, ok := set[name]; ok {
			env = append(env, name+"="+v)
		}
	}
	return env
}
