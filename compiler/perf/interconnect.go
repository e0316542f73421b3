package perf

import (
	"fmt"
	"math"
	"strings"
)

// The all-reduce: how long NCCL takes to sum one gradient bucket over the
// ranks of a data-parallel job, predicted with NCCL's own cost model for
// the ring algorithm (src/graph/tuning.cc, ncclTopoTuneModel and
// ncclTopoGetAlgoTime): time = latency + bytes / algorithm bandwidth, where
//
//   - the algorithm bandwidth of a ring all-reduce is the bus bandwidth ×
//     N / (2(N−1)): each rank sends and receives 2(N−1)/N of the buffer
//     (reduce-scatter, then all-gather), so bytes / algBw = 2(N−1)/N ×
//     bytes / busBw — nccl-tests' busbw is exactly that convention, which
//     is why the table holds bus bandwidths measured by nccl-tests, not
//     link peaks;
//   - the latency is a base latency plus one hop latency per ring step,
//     2(N−1) steps, the 2(M−1) of them that cross between M nodes at the
//     network's hop latency;
//   - NCCL picks, per call, the protocol with the least time: Simple (the
//     full bus bandwidth, the highest latency), LL128 (92% of it) or LL
//     (a quarter, the lowest latency) — small buckets go LL.
//
// The constants are NCCL's (tuning.cc at commit 01afd20a of
// github.com/NVIDIA/nccl, the Ring row of baseLat and hwLat, in µs);
// ncclLL128Share is the 0.92 (120/128) and ncclLLShare the 1/4 there. One
// simplification: NCCL's extra 1.9× latency of multi-node Simple rings
// ("plateau effect") and its per-channel LL128 cap are left out.
const (
	ncclLL128Share = 0.92
	ncclLLShare    = 0.25
)

// ncclProtocol is one of NCCL's protocols' ring constants.
type ncclProtocol struct {
	name    string
	baseLat float64    // seconds
	hopLat  [3]float64 // seconds per ring step over NVLink, PCIe, the network
	bwShare float64    // of the bus bandwidth
}

// hop kinds, the index into ncclProtocol.hopLat (NCCL_HW_NVLINK, _PCI, _NET)
const (
	hopNVLink = iota
	hopPCIe
	hopNet
)

var ncclProtocols = []ncclProtocol{
	{name: "LL", baseLat: 3.6e-6, hopLat: [3]float64{0.47e-6, 1.0e-6, 2.7e-6}, bwShare: ncclLLShare},
	{name: "LL128", baseLat: 10.0e-6, hopLat: [3]float64{1.9e-6, 2.5e-6, 4.0e-6}, bwShare: ncclLL128Share},
	{name: "Simple", baseLat: 8.4e-6, hopLat: [3]float64{3.4e-6, 5.7e-6, 9.6e-6}, bwShare: 1},
}

// Interconnect is a link between GPUs as the all-reduce sees it.
type Interconnect struct {
	Key  string `json:"key"`
	Name string `json:"name"`
	// LinkGBs is the link's peak per GPU and direction (the datasheets'
	// figure, for reference); BusGBs the bus bandwidth NCCL's ring
	// all-reduce reaches at large sizes (nccl-tests' busbw, per GPU), which
	// is what the model uses.
	LinkGBs float64 `json:"link_gb_s"`
	BusGBs  float64 `json:"bus_gb_s"`
	// Hop is NCCL's hardware class for hop latencies (NVLink, PCIe, the
	// network).
	Hop    int    `json:"-"`
	Source string `json:"source"`
}

// Interconnects is the table. Link peaks: NVIDIA's datasheets (H100/H200
// SXM: NVLink 4, 900 GB/s per GPU in total, 450 each way; A100 SXM4: NVLink
// 3, 600 GB/s, 300 each way; PCIe Gen5 x16 64 GB/s and Gen4 x16 32 GB/s each
// way; InfiniBand NDR 400 Gb/s = 50 GB/s each way, one ConnectX-7 per GPU
// as in DGX H100/H200). Bus bandwidths: nccl-tests all_reduce_perf busbw at
// large sizes as Alaya NeW's "NCCL-tests in practice" lists them
// (https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests: 8×H100
// SXM5 NVLink 460-480 GB/s — NCCL then reduces in the NVSwitch (NVLS), which
// is how busbw passes the link's 450; 8×A100 SXM4 230-250; 8×H100 PCIe
// without NVSwitch 35-45): the table takes each range's low end. Not from a
// measurement but estimated alike: PCIe Gen4 at the same share of its link
// as Gen5 (35/64 of 32 GB/s), and InfiniBand NDR at 90% of 50 GB/s per GPU.
var Interconnects = map[string]Interconnect{
	"nvlink4": {Key: "nvlink4", Name: "NVLink 4 (NVSwitch)", LinkGBs: 450, BusGBs: 460, Hop: hopNVLink,
		Source: "nccl-tests busbw, 8×H100 SXM5 (measured range 460-480)"},
	"nvlink3": {Key: "nvlink3", Name: "NVLink 3 (NVSwitch)", LinkGBs: 300, BusGBs: 230, Hop: hopNVLink,
		Source: "nccl-tests busbw, 8×A100 SXM4 (measured range 230-250)"},
	"pcie5": {Key: "pcie5", Name: "PCIe Gen5 x16", LinkGBs: 64, BusGBs: 35, Hop: hopPCIe,
		Source: "nccl-tests busbw, 8×H100 PCIe without NVSwitch (measured range 35-45)"},
	"pcie4": {Key: "pcie4", Name: "PCIe Gen4 x16", LinkGBs: 32, BusGBs: 17.5, Hop: hopPCIe,
		Source: "an estimate: Gen5's measured share of its link (35/64) of Gen4's 32 GB/s"},
	"ib-ndr": {Key: "ib-ndr", Name: "InfiniBand NDR 400 Gb/s per GPU", LinkGBs: 50, BusGBs: 45, Hop: hopNet,
		Source: "an estimate: 90% of the 50 GB/s link, one NIC per GPU"},
}

// gpuLinks are each GPU's own interconnects: NVLink (if any) and PCIe.
var gpuLinks = map[string]struct{ nvlink, pcie string }{
	"h200": {"nvlink4", "pcie5"}, "h100": {"nvlink4", "pcie5"}, "a100": {"nvlink3", "pcie4"},
	"l4": {"", "pcie4"}, "rtx4090": {"", "pcie4"},
}

// Fabric is how the ranks of a job are connected: Ranks GPUs over Nodes
// machines (an equal number on each), Intra between the GPUs of a
// machine, Inter (InfiniBand) between machines.
type Fabric struct {
	Ranks int          `json:"ranks"`
	Nodes int          `json:"nodes"`
	Intra Interconnect `json:"intra_node"`
	Inter Interconnect `json:"inter_node"`
}

// LookupFabric is the fabric of ranks GPUs of the table's gpuKey over
// nodes machines; kind is "nvlink", "pcie", "ib" (every rank on its own
// machine's NIC: the whole ring over InfiniBand) or "" (NVLink where the
// GPU has it, else PCIe).
func LookupFabric(gpuKey, kind string, ranks, nodes int) (Fabric, error) {
	links, ok := gpuLinks[strings.ToLower(gpuKey)]
	if !ok {
		return Fabric{}, fmt.Errorf("no interconnects known for GPU %q", gpuKey)
	}
	if nodes < 1 || ranks < 1 || ranks%nodes != 0 {
		return Fabric{}, fmt.Errorf("%d GPUs do not split evenly over %d nodes", ranks, nodes)
	}
	f := Fabric{Ranks: ranks, Nodes: nodes, Inter: Interconnects["ib-ndr"]}
	switch kind {
	case "", "nvlink":
		key := links.nvlink
		if key == "" {
			if kind == "nvlink" {
				return Fabric{}, fmt.Errorf("the %s has no NVLink (use pcie)", GPUs[strings.ToLower(gpuKey)].Name)
			}
			key = links.pcie
		}
		f.Intra = Interconnects[key]
	case "pcie":
		f.Intra = Interconnects[links.pcie]
	case "ib":
		f.Intra = Interconnects["ib-ndr"]
	default:
		return Fabric{}, fmt.Errorf("unknown interconnect %q (known: nvlink, pcie, ib)", kind)
	}
	return f, nil
}

// busGBs is the ring's bus bandwidth: the intra-node link's, or across
// machines that of the machine's NICs together when lower (each of a
// machine's GPUs has one, and each carries its share of the ring's
// crossings: NCCL runs a ring per channel, the channels spread over the
// NICs).
func (f Fabric) busGBs() float64 {
	if f.Nodes <= 1 {
		return f.Intra.BusGBs
	}
	return math.Min(f.Intra.BusGBs, float64(f.Ranks/f.Nodes)*f.Inter.BusGBs)
}

// AllReduce is one all-reduce's predicted cost (or a group of
// broadcasts', GroupBroadcastSeconds).
type AllReduce struct {
	Bytes    int64   `json:"bytes"`
	Protocol string  `json:"protocol"`
	Latency  float64 `json:"latency_seconds"`
	Seconds  float64 `json:"predicted_seconds"`
}

// AllReduceSeconds predicts NCCL's ring all-reduce of bytes on f: zero on
// one rank (NCCL returns at once), else the fastest protocol's latency +
// 2(N−1)/N × bytes / its share of the bus bandwidth.
func (f Fabric) AllReduceSeconds(bytes int64) AllReduce {
	n := f.Ranks
	out := AllReduce{Bytes: bytes}
	if n <= 1 {
		return out
	}
	steps := 2 * (n - 1)
	inter := 2 * (f.Nodes - 1)
	bus := f.busGBs() * 1e9
	moved := float64(steps) / float64(n) * float64(bytes)
	out.Seconds = math.Inf(1)
	for _, p := range ncclProtocols {
		lat := p.baseLat + float64(steps-inter)*p.hopLat[f.Intra.Hop] + float64(inter)*p.hopLat[hopNet]
		t := lat + moved/(bus*p.bwShare)
		if t < out.Seconds {
			out.Seconds, out.Latency, out.Protocol = t, lat, p.name
		}
	}
	return out
}

// The broadcast: a sharded optimizer's parameters, each sent from the
// rank that updated it to every other (runtime/trainer/shard.go), by NCCL's
// ring broadcast. Its cost follows NCCL's model as the all-reduce's does,
// with a broadcast's counts:
//
//   - the latency is the base latency plus N hop latencies (tuning.cc's
//     nsteps = nRanks for a broadcast: every ring collective but the
//     all-reduce, reduce-scatter and all-gather), the M of them that cross
//     between M > 1 nodes at the network's (its nInterSteps = nNodes; on
//     one machine none, as the all-reduce's 2(M−1) gives none);
//   - every rank receives (and all but the last send) the whole buffer
//     once, so time = latency + bytes / bus bandwidth: for a broadcast
//     nccl-tests' bus bandwidth is its algorithm bandwidth (busBw = algBw,
//     nccl-tests doc/PERFORMANCE.md, "Broadcast"). The bus bandwidth is
//     the table's, but no more than the link's peak: the table's
//     NVLink 4 figure (460 GB/s) passes the 450 GB/s link only by reducing
//     inside the NVSwitch (NVLS), which a broadcast has nothing to gain
//     from.
//
// The broadcasts are issued as one NCCL group (ncclGroupStart/End), which
// NCCL launches as one kernel: the group pays the protocol's base latency
// once and each broadcast its N hops (a broadcast's pipeline fills
// anew: each has its own root), and the bytes add up at the bus bandwidth.
// One simplification: the whole group takes one protocol (NCCL chooses
// per collective).

// broadcastBusGBs is a broadcast's bus bandwidth: the ring's, at most the
// intra-node link's peak.
func (f Fabric) broadcastBusGBs() float64 {
	return math.Min(f.busGBs(), f.Intra.LinkGBs)
}

// BroadcastSeconds predicts NCCL's ring broadcast of bytes on f: zero on
// one rank, else the fastest protocol's latency (the base and N hops) +
// bytes / its share of the bus bandwidth.
func (f Fabric) BroadcastSeconds(bytes int64) AllReduce {
	return f.GroupBroadcastSeconds([]int64{bytes})
}

// GroupBroadcastSeconds predicts broadcasts of the given sizes in one
// NCCL group: one base latency, N hops per broadcast, the bytes added
// up over the bus bandwidth, the protocol fastest for the whole.
func (f Fabric) GroupBroadcastSeconds(sizes []int64) AllReduce {
	out := AllReduce{}
	for _, b := range sizes {
		out.Bytes += b
	}
	n := f.Ranks
	if n <= 1 || len(sizes) == 0 {
		return out
	}
	steps, inter := n, 0
	if f.Nodes > 1 {
		inter = f.Nodes
	}
	bus := f.broadcastBusGBs() * 1e9
	out.Seconds = math.Inf(1)
	for _, p := range ncclProtocols {
		hops := float64(steps-inter)*p.hopLat[f.Intra.Hop] + float64(inter)*p.hopLat[hopNet]
		lat := p.baseLat + float64(len(sizes))*hops
		t := lat + float64(out.Bytes)/(bus*p.bwShare)
		if t < out.Seconds {
			out.Seconds, out.Latency, out.Protocol = t, lat, p.name
		}
	}
	return out
}

// Describe is the fabric in words.
func (f Fabric) Describe() string {
	if f.Nodes <= 1 {
		return fmt.Sprintf("%d GPUs over %s (NCCL bus bandwidth %.0f GB/s; link %.0f GB/s each way)", f.Ranks, f.Intra.Name, f.Intra.BusGBs, f.Intra.LinkGBs)
	}
	return fmt.Sprintf("%d GPUs on %d nodes: %s within a node, %s between nodes (ring bus bandwidth %.0f GB/s)",
		f.Ranks, f.Nodes, f.Intra.Name, f.Inter.Name, f.busGBs())
}
