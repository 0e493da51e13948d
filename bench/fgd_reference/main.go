// Command fgd_reference writes the FGD protocol's workloads as the reference simulator draws them, so that
// `oneplus sim fgd --arrivals` replays exactly the pods, in exactly the order, and the node names behind the
// published per-seed results (hkust-adsl/kubernetes-scheduler-simulator @8f3d6417, experiments/run_scripts:
// `-tune 1.3 -tuneseed SEED --shuffle-pod=true`).
//
// Only Go's math/rand is needed for that, not the simulator: with a seed it is deterministic, and the reference
// calls it in this order (re-implemented here from reading it, no code copied):
//   - pkg/simulator/core.go Simulate: rand.Seed(seed), then one rand.Int() (an argument of a Debugf line);
//   - SortClusterPods: the pods sorted by name, then rand.Shuffle;
//   - TunePodsByNodeTotalResource: above ratio x capacity, rand.Intn(len) pods removed until the total fits;
//     below it, pods drawn with rand.Intn from the list in file order and appended (named <pod>-tuned-<i>) until
//     the next one's per-GPU milli would pass the target;
//   - RunCluster starts the scheduler, which draws ten numbers, then syncClusterResourceList names the nodes:
//     sorted by name, node i gets the prefix rand.Perm(n)[i], and score ties go to the smallest name.
//
// Output, JSON lines: a header {"reference", "pods", "pods_sha256", "nodes", "nodes_sha256", "demand"}, then one
// line a seed {"seed", "arrivals" (row indices of the pod list, in arrival order), "originals" (how many of them
// come first as the list's own pods; the rest are tuned copies), "node_rank" (for the nodes sorted by name, the
// prefix each gets)}.
//
// Usage: go run . -nodes openb_node_list_gpu_node.csv -pods openb_pod_list_multigpu40.csv -seeds 42-51 > out.jsonl
package main

import (
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// schedulerDraws: numbers the reference's scheduler start takes from the global source before the nodes are named.
// Found by matching the node names of a reference run's log (seed 42, multigpu40); checked by the per-seed results.
const schedulerDraws = 10

type pod struct {
	row          int
	name         string
	milli, count int64 // per-GPU milli and GPU count, as the reference's pod annotations carry them
}

func (p pod) totalMilli() int64 { return p.milli * p.count }

type header struct {
	Reference   string  `json:"reference"`
	Pods        string  `json:"pods"`
	PodsSHA256  string  `json:"pods_sha256"`
	Nodes       string  `json:"nodes"`
	NodesSHA256 string  `json:"nodes_sha256"`
	Demand      float64 `json:"demand"`
}

type seedLine struct {
	Seed      int64 `json:"seed"`
	Arrivals  []int `json:"arrivals"`
	Originals int   `json:"originals"`
	NodeRank  []int `json:"node_rank"`
}

func readCSV(path string) ([]map[string]string, string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(raw)
	rows, err := csv.NewReader(strings.NewReader(string(raw))).ReadAll()
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) < 2 {
		return nil, "", fmt.Errorf("%s: no rows", path)
	}
	out := make([]map[string]string, 0, len(rows)-1)
	for _, r := range rows[1:] {
		m := make(map[string]string, len(r))
		for i, k := range rows[0] {
			m[k] = strings.TrimSpace(r[i])
		}
		out = append(out, m)
	}
	return out, hex.EncodeToString(sum[:]), nil
}

func number(row map[string]string, key string) int64 {
	v, err := strconv.ParseInt(row[key], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// pods as pod_csv_to_yaml.py annotates them: a GPU count, and a per-GPU milli clipped to 0..1000.
func loadPods(rows []map[string]string) []pod {
	out := make([]pod, len(rows))
	for i, r := range rows {
		p := pod{row: i, name: r["name"], count: number(r, "num_gpu")}
		if p.count != 0 {
			if m := number(r, "gpu_milli"); m > 1000 {
				p.milli = 1000
			} else if m > 0 {
				p.milli = m
			}
		}
		out[i] = p
	}
	return out
}

func parseSeeds(text string) ([]int64, error) {
	if lo, hi, ok := strings.Cut(text, "-"); ok {
		a, err1 := strconv.ParseInt(lo, 10, 64)
		b, err2 := strconv.ParseInt(hi, 10, 64)
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("-seeds %q: expected FIRST-LAST", text)
		}
		var out []int64
		for s := a; s <= b; s++ {
			out = append(out, s)
		}
		return out, nil
	}
	var out []int64
	for _, f := range strings.Split(text, ",") {
		s, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("-seeds %q: expected FIRST-LAST or a comma list", text)
		}
		out = append(out, s)
	}
	return out, nil
}

func draw(seed int64, listed []pod, nodeNames []string, capacityMilli int64, demand float64) seedLine {
	rand.Seed(seed)
	_ = rand.Int()
	pods := append([]pod(nil), listed...)
	sort.Slice(pods, func(i, j int) bool { return pods[i].name < pods[j].name })
	rand.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
	var total int64
	for _, p := range pods {
		total += p.totalMilli()
	}
	target := demand * float64(capacityMilli)
	originals := len(pods)
	if float64(total) > target {
		for float64(total) > target && len(pods) > 0 {
			i := rand.Intn(len(pods))
			total -= pods[i].totalMilli()
			pods = append(pods[:i], pods[i+1:]...)
		}
		originals = len(pods)
	} else if float64(total) < target {
		for {
			p := listed[rand.Intn(len(listed))]
			if float64(total+p.milli) > target {
				break
			}
			total += p.totalMilli()
			pods = append(pods, p)
		}
	}
	for i := 0; i < schedulerDraws; i++ {
		rand.Int63()
	}
	line := seedLine{Seed: seed, Originals: originals, NodeRank: rand.Perm(len(nodeNames))}
	line.Arrivals = make([]int, len(pods))
	for i, p := range pods {
		line.Arrivals[i] = p.row
	}
	return line
}

func main() {
	nodesPath := flag.String("nodes", "", "the openb node list (openb_node_list_gpu_node.csv)")
	podsPath := flag.String("pods", "", "an openb pod list (openb_pod_list_*.csv)")
	seedsText := flag.String("seeds", "42-51", "FIRST-LAST or a comma list")
	demand := flag.Float64("demand", 1.3, "the tuning ratio: requested GPUs as a share of capacity")
	flag.Parse()
	if *nodesPath == "" || *podsPath == "" {
		fmt.Fprintln(os.Stderr, "usage: fgd_reference -nodes NODES.csv -pods PODS.csv [-seeds 42-51] [-demand 1.3]")
		os.Exit(2)
	}
	seeds, err := parseSeeds(*seedsText)
	fail(err)
	nodeRows, nodesSum, err := readCSV(*nodesPath)
	fail(err)
	podRows, podsSum, err := readCSV(*podsPath)
	fail(err)
	var capacity int64
	nodeNames := make([]string, len(nodeRows))
	for i, r := range nodeRows {
		capacity += number(r, "gpu") * 1000
		nodeNames[i] = r["sn"]
	}
	sort.Strings(nodeNames)
	enc := json.NewEncoder(os.Stdout)
	fail(enc.Encode(header{
		Reference:   "hkust-adsl/kubernetes-scheduler-simulator@8f3d6417353c5083c6d56617f255fadd8dc306bc",
		Pods:        filepath.Base(*podsPath),
		PodsSHA256:  podsSum,
		Nodes:       filepath.Base(*nodesPath),
		NodesSHA256: nodesSum,
		Demand:      *demand,
	}))
	listed := loadPods(podRows)
	for _, s := range seeds {
		fail(enc.Encode(draw(s, listed, nodeNames, capacity, *demand)))
	}
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "fgd_reference:", err)
		os.Exit(1)
	}
}
