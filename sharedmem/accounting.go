package sharedmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Rollup is a process's memory from /proc/PID/smaps_rollup, in bytes.
type Rollup struct {
	RSS          int64 `json:"rss_bytes"`
	PSS          int64 `json:"pss_bytes"`
	SharedClean  int64 `json:"shared_clean_bytes"`
	SharedDirty  int64 `json:"shared_dirty_bytes"`
	PrivateClean int64 `json:"private_clean_bytes"`
	PrivateDirty int64 `json:"private_dirty_bytes"`
}

// ReadRollup reads /proc/PID/smaps_rollup.
func ReadRollup(pid int) (Rollup, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return Rollup{}, fmt.Errorf("memory of pid %d: %w", pid, err)
	}
	return parseRollup(data)
}

func parseRollup(data []byte) (Rollup, error) {
	var r Rollup
	fields := map[string]*int64{
		"Rss": &r.RSS, "Pss": &r.PSS, "Shared_Clean": &r.SharedClean, "Shared_Dirty": &r.SharedDirty,
		"Private_Clean": &r.PrivateClean, "Private_Dirty": &r.PrivateDirty,
	}
	found := 0
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		p, want := fields[key]
		if !ok || !want {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return r, fmt.Errorf("smaps_rollup: bad line %q", sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return r, fmt.Errorf("smaps_rollup: bad line %q", sc.Text())
		}
		*p = kb << 10
		found++
	}
	if found != len(fields) {
		return r, fmt.Errorf("smaps_rollup: found %d of %d fields", found, len(fields))
	}
	return r, nil
}
