//go:build integration

package tests

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echoServers are two TCP echo servers and a UDP sink on the host's
// loopback, which a guest on QEMU's user network reaches as 10.0.2.2: its
// QEMU's slirp connects and sends from the host, inside the machine's
// egress cgroup. The sink records what it got (the test guest's busybox
// has no UDP nc; its tftp sends a datagram naming a file).
type echoServers struct {
	tcp, tcpOther, udp int
	mu                 sync.Mutex
	got                []string
}

func (s *echoServers) gotUDP(token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.got {
		if strings.Contains(g, token) {
			return true
		}
	}
	return false
}

func startEchoServers(t *testing.T) *echoServers {
	t.Helper()
	tcpEcho := func() int {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
						c.Write([]byte("echo " + line))
					}
				}()
			}
		}()
		return l.Addr().(*net.TCPAddr).Port
	}
	u, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	s := &echoServers{tcp: tcpEcho(), tcpOther: tcpEcho(), udp: u.LocalAddr().(*net.UDPAddr).Port}
	go func() {
		buf := make([]byte, 1500)
		for {
			n, _, err := u.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got = append(s.got, string(buf[:n]))
			s.mu.Unlock()
		}
	}()
	return s
}

var probeSeq atomic.Int64

// reachesUDP reports whether a datagram machine name sends to the host's
// loopback port reaches srv's sink.
func (e *env) reachesUDP(name string, srv *echoServers) bool {
	e.t.Helper()
	token := fmt.Sprintf("probe-%s-%d", name, probeSeq.Add(1))
	e.vmfork("exec", name, "--", "timeout", "3", "tftp", "-g", "-r", token, "-l", "/dev/null", "10.0.2.2", strconv.Itoa(srv.udp))
	deadline := time.Now().Add(2 * time.Second)
	for !srv.gotUDP(token) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// ticker is a TCP server on the host's loopback that writes a tick to each
// connection every 100 ms until it goes: a peer that holds connections
// open across a fork.
type ticker struct {
	port  int
	mu    sync.Mutex
	conns int
}

func startTicker(t *testing.T) *ticker {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	tk := &ticker{port: l.Addr().(*net.TCPAddr).Port}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			tk.mu.Lock()
			tk.conns++
			tk.mu.Unlock()
			go func() {
				defer c.Close()
				for i := 0; ; i++ {
					if _, err := fmt.Fprintf(c, "tick %d\n", i); err != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
		}
	}()
	return tk
}

// reaches reports whether machine name gets an echo from the host's
// loopback TCP port (busybox nc; its wget crashes in the test guest).
func (e *env) reaches(name string, port int) bool {
	e.t.Helper()
	r := e.vmfork("exec", name, "--", "sh", "-c", fmt.Sprintf("echo hi | nc -w 3 10.0.2.2 %d", port))
	return strings.Contains(r.stdout, "echo hi")
}

// contractOf is machine name's contract as vmfork contract --json shows it.
func (e *env) contractOf(name string) (egress string, rules []string) {
	e.t.Helper()
	var st struct {
		Contract *struct {
			Network *struct {
				Egress json.RawMessage `json:"egress"`
			} `json:"network"`
		} `json:"contract"`
		Rules []string `json:"rules"`
	}
	e.jsonOK(&st, "contract", name)
	if st.Contract == nil || st.Contract.Network == nil {
		return "", st.Rules
	}
	return string(st.Contract.Network.Egress), st.Rules
}

// stepDetail is the detail of step in child's identity result in fr.
func stepDetail(fr forkIDJSON, child, step string) string {
	for _, c := range fr.Children {
		if c.Name == child && c.Identity != nil {
			return c.Identity.step(step).Detail
		}
	}
	return ""
}

// dropCount is the packet count of the rule whose line holds what.
var packets = regexp.MustCompile(`\[(\d+) packets?\]`)

func dropCount(t *testing.T, rules []string, what string) int {
	t.Helper()
	for _, r := range rules {
		if strings.Contains(r, what) {
			if m := packets.FindStringSubmatch(r); m != nil {
				n, _ := strconv.Atoi(m[1])
				return n
			}
		}
	}
	t.Fatalf("no rule %q among %q", what, rules)
	return 0
}

// egressTables lists the host's nftables tables of this env's machines:
// the embedded driver names them vmfork-NAME-HASH, HASH a digest of the
// state dir (qemudrv/contract.go, egressKey).
func (e *env) egressTables() string {
	e.t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		e.t.Fatalf("nft list tables: %v: %s", err, out)
	}
	sum := sha256.Sum256([]byte(e.stateDir))
	suffix := "-" + hex.EncodeToString(sum[:4])
	var ts []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); strings.Contains(l, " vmfork-") && strings.HasSuffix(l, suffix) {
			ts = append(ts, l)
		}
	}
	return strings.Join(ts, "; ")
}

// TestContractUserNetwork is issue 22's egress on QEMU's user network: a
// child with egress none reaches nothing its parent reaches (TCP and UDP),
// one with an allow list exactly what it lists (by a name the host
// resolves), link-local never; the parent is unchanged. The contract is
// inherited by a fork of a child and by a kept template's children, kept
// by a rewind, shown by ls --json and --dry-run, changed in place by
// --set, and its rules go with the machine.
func TestContractUserNetwork(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	srv := startEchoServers(t)
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// c-none's contract resets its inherited connections (the default);
	// c-allow's keeps them.
	none := write("none.yaml", "network: {egress: none}\n")
	allow := write("allow.yaml", fmt.Sprintf("network: {egress: {allow: [localhost:%d]}, connections: keep}\n", srv.tcp))
	e.boot("src")
	if !e.reaches("src", srv.tcp) || !e.reachesUDP("src", srv) {
		t.Fatal("the source does not reach the host's echo servers: the test cannot tell anything")
	}
	// The source holds a connection open across the forks: a reader that
	// notes when its connection ends.
	tk := startTicker(t)
	e.exec("src", "sh", "-c", fmt.Sprintf("(nc 10.0.2.2 %d >/tmp/held.out; echo ended >/tmp/held.done) >/dev/null 2>&1 &", tk.port))
	if !eventually(10*time.Second, func() bool {
		out, _ := e.tryExec("src", "cat", "/tmp/held.out")
		return strings.Contains(out, "tick 2")
	}) {
		t.Fatal("the source's reader gets no ticks")
	}

	// The dry run shows the children's contract.
	var plan struct {
		Contract struct {
			Network struct {
				Egress string `json:"egress"`
			} `json:"network"`
		} `json:"contract"`
	}
	e.jsonOK(&plan, "fork", "src", "c-none", "--contract", none, "--dry-run")
	if plan.Contract.Network.Egress != "none" {
		t.Errorf("dry run's contract %+v, want egress none", plan.Contract)
	}
	var fr forkIDJSON
	e.jsonOK(&fr, "fork", "src", "c-none", "--contract", none)
	ready := time.Now()
	t.Run("connections reset", func(t *testing.T) {
		// Closed before the child's NIC came up: its reader has ended by
		// the time it is READY (within 1 s, for the guest to write it down).
		if !eventually(time.Second, func() bool {
			out, _ := e.tryExec("c-none", "cat", "/tmp/held.done")
			return strings.Contains(out, "ended")
		}) {
			t.Errorf("c-none's reader of the inherited connection still waits %v after READY", time.Since(ready))
		}
		if d := stepDetail(fr, "c-none", "vmfork.connections"); !strings.Contains(d, "closed 1 inherited") {
			t.Errorf("c-none's connections step: %q, want 1 closed", d)
		}
		// The peer only ever talks to the parent, and still does.
		out1, _ := e.tryExec("src", "wc", "-l", "/tmp/held.out")
		time.Sleep(500 * time.Millisecond)
		out2, _ := e.tryExec("src", "wc", "-l", "/tmp/held.out")
		if out1 == out2 {
			t.Errorf("the parent's reader stopped getting ticks after the fork (%q, then %q)", out1, out2)
		}
		if r := e.vmfork("exec", "src", "--", "test", "-e", "/tmp/held.done"); r.code == 0 {
			t.Error("the parent's connection ended with the fork")
		}
		tk.mu.Lock()
		defer tk.mu.Unlock()
		if tk.conns != 1 {
			t.Errorf("the peer saw %d connections, want the parent's alone", tk.conns)
		}
	})
	e.ok("fork", "src", "c-allow", "--contract", allow)
	t.Run("egress none", func(t *testing.T) {
		if e.reaches("c-none", srv.tcp) || e.reachesUDP("c-none", srv) {
			t.Error("a child with egress none reached the host's echo servers")
		}
	})
	t.Run("allow", func(t *testing.T) {
		if !e.reaches("c-allow", srv.tcp) {
			t.Error("a child allowed localhost:PORT does not reach it")
		}
		if e.reaches("c-allow", srv.tcpOther) || e.reachesUDP("c-allow", srv) {
			t.Error("a child allowed one TCP port reached another port or UDP")
		}
		e.vmfork("exec", "c-allow", "--", "sh", "-c", "echo hi | nc -w 2 169.254.169.254 80")
		if _, rules := e.contractOf("c-allow"); dropCount(t, rules, "drop link-local 169.254.0.0/16") == 0 {
			t.Errorf("no packet to 169.254.169.254 was dropped: %q", rules)
		}
	})
	t.Run("parent unchanged", func(t *testing.T) {
		if !e.reaches("src", srv.tcp) || !e.reachesUDP("src", srv) {
			t.Error("the children's contracts changed what their parent reaches")
		}
		if egress, _ := e.contractOf("src"); egress != "" {
			t.Errorf("the parent got a contract: %s", egress)
		}
	})
	t.Run("inherited", func(t *testing.T) {
		e.ok("fork", "c-allow", "kid")
		e.ok("template", "save", "c-allow", "allow-tpl")
		e.ok("fork", "allow-tpl", "tpl-kid")
		for _, m := range e.list() {
			if m.Name != "kid" && m.Name != "tpl-kid" {
				continue
			}
			if egress, _ := e.contractOf(m.Name); !strings.Contains(egress, "allow") {
				t.Errorf("%s: contract egress %s, want c-allow's", m.Name, egress)
			}
		}
		if !e.reaches("kid", srv.tcp) || e.reaches("kid", srv.tcpOther) {
			t.Error("a fork of c-allow is not held to c-allow's contract")
		}
	})
	t.Run("rewind keeps it", func(t *testing.T) {
		e.ok("checkpoint", "c-none", "--as", "none-cp")
		e.ok("rewind", "c-none", "--to", "none-cp")
		if egress, _ := e.contractOf("c-none"); egress != `"none"` {
			t.Errorf("after a rewind c-none's egress is %s, want none", egress)
		}
		if e.reaches("c-none", srv.tcp) {
			t.Error("a rewound c-none reaches the host")
		}
	})
	t.Run("set in place", func(t *testing.T) {
		e.ok("contract", "c-none", "--set", allow)
		if !e.reaches("c-none", srv.tcp) {
			t.Error("after --set to the allow list, c-none does not reach the allowed port")
		}
	})
	for _, m := range []string{"tpl-kid", "kid", "c-allow", "c-none", "src"} {
		e.ok("rm", m)
	}
	e.ok("template", "rm", "allow-tpl")
	e.ok("template", "rm", "none-cp")
	if left := e.egressTables(); left != "" {
		t.Errorf("rm left nftables tables: %s", left)
	}
}
