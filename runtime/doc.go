// Package runtime is what generated trainers link: devices, data loading,
// checkpoints, progress and logs. Sub-packages keep each concern apart;
// none of them imports gorgonia.org/cu except behind the `cuda` build tag,
// because that package exits at start on machines without a GPU.
package runtime
