//! The NCCL unique-id rendezvous (controller side). Status: not written yet (issue 5).
