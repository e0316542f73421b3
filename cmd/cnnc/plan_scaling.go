package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cnnc/cnnc/compiler"
	"github.com/cnnc/cnnc/compiler/perf"
	"github.com/cnnc/cnnc/compiler/plan"
	"github.com/cnnc/cnnc/driver"
)

// maxScalingRows bounds --scaling's list: each count is a plan to compile
// and predict.
const maxScalingRows = 16

// checkScalingFlags checks the data-parallel prediction's flags
// (--interconnect, --nnodes, --scaling) against the others.
func checkScalingFlags(pf *planFlags) error {
	dataParallel := pf.gpus > 1 || pf.scaling != ""
	switch {
	case (pf.interconnect != "" || pf.nnodes != 1) && (pf.gpu == "" || !dataParallel):
		return fmt.Errorf("--interconnect and --nnodes describe the all-reduce's links: they need --gpu and --gpus N or --scaling")
	case pf.nnodes < 1 || pf.nnodes > plan.MaxRanks:
		return fmt.Errorf("--nnodes %d: want between 1 and %d machines", pf.nnodes, plan.MaxRanks)
	case pf.scaling != "" && pf.gpu == "":
		return fmt.Errorf("--scaling predicts steps: it needs --gpu")
	case pf.gpus > 1 && pf.gpus%pf.nnodes != 0:
		return fmt.Errorf("--gpus %d: the GPUs do not split evenly over --nnodes %d machines", pf.gpus, pf.nnodes)
	case pf.scaling != "" && pf.gpus > 1:
		return fmt.Errorf("--scaling gives the GPU counts itself: drop --gpus")
	}
	switch pf.interconnect {
	case "", "nvlink", "pcie", "ib":
	default:
		return fmt.Errorf("--interconnect %q: want nvlink, pcie or ib", pf.interconnect)
	}
	if pf.scaling != "" {
		if _, err := parseScaling(pf.scaling, pf.nnodes); err != nil {
			return err
		}
	}
	return nil
}

// parseScaling reads --scaling's GPU counts: whole numbers from 1 on,
// increasing, each a multiple of the machines.
func parseScaling(list string, nodes int) ([]int, error) {
	var counts []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		switch {
		case err != nil || n < 1 || n > plan.MaxRanks:
			return nil, fmt.Errorf("--scaling %q: %q is not a GPU count between 1 and %d", list, f, plan.MaxRanks)
		case len(counts) > 0 && n <= counts[len(counts)-1]:
			return nil, fmt.Errorf("--scaling %q: list the GPU counts in increasing order", list)
		case n%nodes != 0 && n > 1:
			return nil, fmt.Errorf("--scaling %q: %d GPUs do not split evenly over --nnodes %d", list, n, nodes)
		}
		counts = append(counts, n)
	}
	if len(counts) > maxScalingRows {
		return nil, fmt.Errorf("--scaling %q: at most %d GPU counts", list, maxScalingRows)
	}
	return counts, nil
}

// parallelPrediction is `cnnc plan --gpu NAME --gpus N`: the rank's plan
// (chosen, with its buckets' all-reduces: ch.Parallel) beside one GPU's
// step at the rank's batch for the scaling efficiency.
func parallelPrediction(path string, res *compiler.Result, cfg plan.Config, gpu perf.GPU, ch *perf.Choice, stderr io.Writer) (*perf.ParallelPrediction, error) {
	pp := ch.Parallel
	one, oneCfg := *res, cfg
	one.Train.Batch /= int64(cfg.Ranks)
	oneCfg.Ranks, oneCfg.ShardOptimizer = 0, false
	oneCh, _, err := fastestPlan(path, &one, oneCfg, gpu, nil, stderr)
	if err != nil {
		return nil, err
	}
	pp.CompareOneDevice(oneCh.Prediction.PredictedStepSeconds)
	return pp, nil
}

// scalingRow is one GPU count's predicted step.
type scalingRow struct {
	GPUs        int     `json:"gpus"`
	Nodes       int     `json:"nodes"`
	GlobalBatch int64   `json:"global_batch"`
	Launches    int     `json:"launches"`
	Step        float64 `json:"predicted_step_seconds"`
	AllReduce   float64 `json:"all_reduce_seconds"`
	Exposed     float64 `json:"exposed_all_reduce_seconds"`
	// Broadcast is a sharded optimizer's parameter broadcasts (after the
	// updates, not overlapped).
	Broadcast  float64 `json:"broadcast_seconds,omitempty"`
	Samples    float64 `json:"samples_per_second"`
	Efficiency float64 `json:"scaling_efficiency"`
}

// runScaling is `cnnc plan --gpu NAME --scaling 1,2,4,8`: the batch per
// GPU fixed (the model's, or --batch), the step of one rank of each count
// (one GPU: the ordinary plan) and the throughput against one GPU's. A
// rank's launches are the same for every count at the same batch per GPU,
// only constants differ (the global batch), so one prediction of them
// serves every count whose compiled launches match (perf.SameLaunches).
func runScaling(path string, res *compiler.Result, cfg plan.Config, pf *planFlags, gpu perf.GPU, stdout, stderr io.Writer) error {
	counts, _ := parseScaling(pf.scaling, pf.nnodes) // checked in runPlan
	perGPU := res.Train.Batch
	oneCfg := cfg
	oneCfg.Ranks, oneCfg.ShardOptimizer = 0, false // one GPU shares nothing
	oneCh, _, err := fastestPlan(path, res, oneCfg, gpu, nil, stderr)
	if err != nil {
		return err
	}
	oneStep := oneCh.Prediction.PredictedStepSeconds
	var rows []scalingRow
	var prev *perf.Choice
	for _, n := range counts {
		if n == 1 {
			rows = append(rows, scalingRow{GPUs: 1, Nodes: 1, GlobalBatch: perGPU, Launches: len(oneCh.Prediction.Launches), Step: oneStep,
				Samples: float64(perGPU) / oneStep, Efficiency: 1})
			continue
		}
		rank, rankCfg := *res, cfg
		rank.Train.Batch = perGPU * int64(n)
		rankCfg.Ranks = n
		fabric, err := perf.LookupFabric(pf.gpu, pf.interconnect, n, pf.nnodes)
		if err != nil {
			fmt.Fprintf(stderr, "cnnc: --scaling: %v\n", err)
			return exitError{exitUsage}
		}
		ch, err := scalingChoice(path, &rank, rankCfg, gpu, &fabric, prev, stderr)
		if err != nil {
			return err
		}
		prev = ch
		pp := ch.Parallel // nil when scalingChoice reused the previous count's launches
		if pp == nil {
			if pp, err = perf.ParallelStep(ch.Best, ch.Prediction, fabric); err != nil {
				fmt.Fprintf(stderr, "cnnc: %v\n", err)
				return exitError{exitModel}
			}
		}
		pp.CompareOneDevice(oneStep)
		row := scalingRow{GPUs: n, Nodes: pf.nnodes, GlobalBatch: rank.Train.Batch, Launches: len(ch.Prediction.Launches),
			Step: pp.PredictedStepSeconds, AllReduce: pp.AllReduceSeconds, Exposed: pp.ExposedSeconds, Samples: pp.SamplesPerSecond, Efficiency: pp.ScalingEfficiency}
		if pp.Shard != nil {
			row.Broadcast = pp.Shard.Broadcast.Seconds
		}
		rows = append(rows, row)
	}
	if pf.json {
		return writeJSON(stdout, struct {
			GPU       string       `json:"gpu"`
			Model     string       `json:"model"`
			BatchPer  int64        `json:"batch_per_gpu"`
			Precision string       `json:"precision"`
			Rows      []scalingRow `json:"scaling"`
			Note      string       `json:"note"`
		}{gpu.Name, res.Graph.Name, perGPU, res.Train.Precision, rows, scalingNote})
	}
	f, _ := perf.LookupFabric(pf.gpu, pf.interconnect, pf.nnodes, pf.nnodes) // checked in runGPUPrediction
	link := f.Intra.Name
	if pf.nnodes > 1 {
		link += fmt.Sprintf(" within each of %d machines, %s between them", pf.nnodes, f.Inter.Name)
	}
	fmt.Fprintf(stdout, "Predicted data-parallel scaling of %s on %s over %s, batch %d per GPU — PREDICTIONS of cnnc's performance model, not measurements:\n\n", res.Graph.Name, gpu.Name, link, perGPU)
	if pf.shardOpt {
		fmt.Fprintf(stdout, "%5s %6s %12s %9s %14s %13s %12s %12s %12s %11s\n", "GPUs", "nodes", "global batch", "launches", "step µs", "all-reduce µs", "exposed µs", "broadcast µs", "samples/s", "efficiency")
	} else {
		fmt.Fprintf(stdout, "%5s %6s %12s %9s %14s %13s %12s %12s %11s\n", "GPUs", "nodes", "global batch", "launches", "step µs", "all-reduce µs", "exposed µs", "samples/s", "efficiency")
	}
	for _, r := range rows {
		fmt.Fprintf(stdout, "%5d %6d %12d %9d %14.1f %13.1f %12.1f ", r.GPUs, r.Nodes, r.GlobalBatch, r.Launches, 1e6*r.Step, 1e6*r.AllReduce, 1e6*r.Exposed)
		if pf.shardOpt {
			fmt.Fprintf(stdout, "%12.1f ", 1e6*r.Broadcast)
		}
		fmt.Fprintf(stdout, "%12.0f %10.1f%%\n", r.Samples, 100*r.Efficiency)
	}
	fmt.Fprintf(stdout, "\n%s\n", scalingNote)
	if pf.shardOpt {
		fmt.Fprintf(stdout, "%s\n", shardScalingNote)
	}
	return nil
}

const scalingNote = "efficiency = samples/s over GPUs × one GPU's (the batch per GPU fixed); all-reduces by NCCL's ring cost model over the table's bus bandwidths, overlapped with the backward pass on a second stream (compiler/perf)"

const shardScalingNote = "--shard-optimizer: from 2 GPUs each rank runs its share of the updates and then broadcasts the parameters (one NCCL group, ring broadcast cost, after the updates: not overlapped); the step is the slowest rank's plus the broadcasts"

// scalingChoice is the fastest rank plan for rankCfg; the previous
// count's prediction is reused when its plan was the only one and this
// count's launches are the same.
func scalingChoice(path string, rank *compiler.Result, rankCfg plan.Config, gpu perf.GPU, fabric *perf.Fabric, prev *perf.Choice, stderr io.Writer) (*perf.Choice, error) {
	if prev != nil && len(prev.Considered) == 1 && prev.Unbudgeted == nil {
		alts, unbudgeted, err := driver.Alternatives(rank, rankCfg, driver.CUDA)
		if err != nil {
			return nil, planError(path, err, stderr)
		}
		if len(alts) == 1 && unbudgeted == nil && perf.SameLaunches(alts[0], prev.Best) {
			return &perf.Choice{Best: alts[0], Prediction: prev.Prediction, Considered: prev.Considered}, nil
		}
	}
	ch, _, err := fastestPlan(path, rank, rankCfg, gpu, fabric, stderr)
	return ch, err
}
