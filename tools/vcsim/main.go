// vcsim-vclmgr: VMware's vSphere simulator (govmomi's simulator package) for vclmgr's tests.
//
// It builds a vCenter model, serves it over plain HTTP and prints ONE JSON line on stdout:
// {"url": "http://user:pass@127.0.0.1:PORT/sdk", "hosts": [{"name", "cpus", "memory_mib"}]}.
// Host capacities cycle through -host-cpus / -host-memory-mib so hosts differ. Without
// -username any non-empty login is accepted (the simulator's default). It exits on
// SIGTERM/SIGINT, or when stdin reaches EOF with -stdin-eof (so it dies with its parent).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmware/govmomi/simulator"
)

func ints(list string) []int64 {
	var out []int64
	for _, s := range strings.Split(list, ",") {
		if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	clusters := flag.Int("cluster", 1, "clusters per datacenter")
	clusterHosts := flag.Int("host", 3, "hosts per cluster")
	standalone := flag.Int("standalone-host", 1, "standalone hosts per datacenter")
	vms := flag.Int("vm", 0, "VMs created per resource pool")
	cpus := flag.String("host-cpus", "", "comma list of CPU core counts, cycled over hosts by name")
	mem := flag.String("host-memory-mib", "", "comma list of memory sizes (MiB), cycled over hosts by name")
	user := flag.String("username", "", "accept only this user name (default: any non-empty login)")
	pass := flag.String("password", "", "password for -username")
	stdinEOF := flag.Bool("stdin-eof", false, "exit when stdin is closed")
	flag.Parse()

	model := simulator.VPX()
	model.Cluster, model.ClusterHost, model.Host, model.Machine = *clusters, *clusterHosts, *standalone, *vms
	if err := model.Create(); err != nil {
		log.Fatal(err)
	}
	defer model.Remove()
	model.Service.Listen = &url.URL{Host: *listen}
	if *user != "" {
		model.Service.Listen.User = url.UserPassword(*user, *pass)
	}
	server := model.Service.NewServer()
	defer server.Close()

	type host struct {
		Name      string `json:"name"`
		CPUs      int64  `json:"cpus"`
		MemoryMiB int64  `json:"memory_mib"`
	}
	var hosts []*simulator.HostSystem
	for _, e := range simulator.Map.All("HostSystem") {
		hosts = append(hosts, e.(*simulator.HostSystem))
	}
	sort.Slice(hosts, func(i, j int) bool { return hosts[i].Name < hosts[j].Name })
	cpuList, memList := ints(*cpus), ints(*mem)
	report := struct {
		URL   string `json:"url"`
		Hosts []host `json:"hosts"`
	}{URL: server.URL.String()}
	for i, h := range hosts {
		if len(cpuList) > 0 {
			n := cpuList[i%len(cpuList)]
			h.Hardware.CpuInfo.NumCpuCores, h.Summary.Hardware.NumCpuCores = int16(n), int16(n)
			h.Summary.Hardware.NumCpuThreads = int16(n)
		}
		if len(memList) > 0 {
			b := memList[i%len(memList)] * 1024 * 1024
			h.Hardware.MemorySize, h.Summary.Hardware.MemorySize = b, b
		}
		report.Hosts = append(report.Hosts, host{h.Name, int64(h.Summary.Hardware.NumCpuCores), h.Summary.Hardware.MemorySize >> 20})
	}
	line, _ := json.Marshal(report)
	fmt.Println(string(line))

	done := make(chan os.Signal, 1)
	signal.Notify(done, syscall.SIGTERM, syscall.SIGINT)
	if *stdinEOF {
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); done <- syscall.SIGTERM }()
	}
	<-done
}
