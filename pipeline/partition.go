package pipeline

import "hash/fnv"

// Partitions is the fixed number of partitions conversations are split into.
// It never changes for a deployment: a conversation must always land in the
// same partition, so that, with several instances, exactly one instance
// applies its inputs.
const Partitions = 256

// Partition returns the partition of a conversation id (FNV-1a).
func Partition(conv string) int {
	h := fnv.New32a()
	h.Write([]byte(conv))
	return int(h.Sum32() % Partitions)
}
