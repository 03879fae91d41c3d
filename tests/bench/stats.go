package bench

import (
	"bufio"
	"bytes"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Median returns the median of v; 0 when v is empty (0 means "not measured"
// throughout this package, since JSON has no NaN).
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Percentile returns the p-th percentile (0-100) of v by the nearest-rank
// method; 0 when v is empty.
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// Factor returns a/b, or 0 when either is unmeasured (0).
func Factor(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return a / b
}

// GrowthExponent is the slope of y against x on a log-log scale between two
// points: 1 means y grows as fast as x, 0 means not at all. It returns 0 when
// a value is missing.
func GrowthExponent(x1, y1, x2, y2 float64) float64 {
	if x1 <= 0 || x2 <= 0 || y1 <= 0 || y2 <= 0 || x1 == x2 {
		return 0
	}
	return math.Log(y2/y1) / math.Log(x2/x1)
}

// mib converts bytes to MiB.
func mib(b int64) float64 { return float64(b) / (1 << 20) }

// memAvailable returns the host's MemAvailable in bytes.
func memAvailable() int64 { return meminfo("MemAvailable") }

// meminfo returns one field of /proc/meminfo in bytes (0 if absent).
func meminfo(field string) int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return parseMeminfo(data, field)
}

func parseMeminfo(data []byte, field string) int64 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || k != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		return n
	}
	return 0
}
